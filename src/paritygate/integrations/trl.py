"""``ParityGateCallback``: gate every checkpoint a transformers/TRL ``Trainer`` saves.

::

    from paritygate.integrations.trl import ParityGateCallback

    trainer = GRPOTrainer(model=..., args=GRPOConfig(output_dir="grpo_out", save_steps=100, ...))
    ParityGateCallback.attach(trainer, "configs/grpo_out.yaml", stop_on_fail=True)
    trainer.train()

On each ``on_save`` (main process only) the checkpoint just written is gated by
``paritygate run CONFIG --checkpoint <output_dir>/checkpoint-N`` in a subprocess; the reports go
to ``<output_dir>/paritygate/checkpoint-N/`` beside the checkpoint; ``paritygate/passed``, the
exit code, the counts and each check's key metric go through ``trainer.log`` (so ``report_to``
decides where: TensorBoard, W&B, ...); the status and root cause kind are one line on the
transformers logger; ``<output_dir>/paritygate/metrics.jsonl`` and a TensorBoard event file
there record every gate. A gate that ends in bad input (exit 2) or an error is logged with its
one line and training goes on; ``stop_on_fail`` stops training (``control.should_training_stop``)
on any outcome but a pass.

A run that has no baseline yet starts itself: ``bless_first=True`` blesses the first checkpoint
it saves (``paritygate run --bless-first``, its step recorded in the baseline's provenance) and
gates every later one against it; a baseline that already exists is never re-blessed (that
first gate is bad input naming the file). :meth:`ParityGateCallback.from_trainer` writes the
config from the trainer before anything is saved::

    trainer = GRPOTrainer(model=model, args=GRPOConfig(output_dir="grpo_out", save_steps=50, ...),
                          ...)
    ParityGateCallback.from_trainer(trainer, prompts=["the cat sat on", ...], bless_first=True)
    trainer.train()
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from transformers import TrainerCallback
from transformers.utils import logging as hf_logging

from paritygate.integrations.common import GateOutcome, TrackerFiles, gate_checkpoint

__all__ = ["ParityGateCallback"]

logger = hf_logging.get_logger("paritygate")


class _Trainer(Protocol):
    """What :meth:`ParityGateCallback.from_trainer` reads: the arguments and the dataset."""

    args: object
    train_dataset: object

    def add_callback(self, callback: object) -> None: ...


class ParityGateCallback(TrainerCallback):  # type: ignore[misc]
    """Gates each saved ``checkpoint-N`` with a paritygate config (see the module docstring).

    ``config``: the gate config (its model directory is replaced by the checkpoint, its name
    and golden baselines are kept). ``checks``: run only these check ids. ``timeout_s``: the
    most one gate may take (then an ``error`` outcome). ``trainer``: where metrics are logged
    (``attach`` sets it); without one they reach only the JSON lines and the event file.
    ``bless_first``: bless the first checkpoint saved as the run's baseline (none may exist).
    """

    def __init__(
        self,
        config: str | Path,
        *,
        stop_on_fail: bool = False,
        checks: list[str] | None = None,
        timeout_s: float | None = None,
        trainer: Any = None,
        bless_first: bool = False,
    ) -> None:
        self.config = Path(config).resolve()
        self.stop_on_fail = stop_on_fail
        self.checks = checks
        self.timeout_s = timeout_s
        self.trainer = trainer
        self.bless_first = bless_first
        self.outcomes: list[GateOutcome] = []
        self._tracker: TrackerFiles | None = None

    @classmethod
    def attach(cls, trainer: Any, config: str | Path, **kwargs: Any) -> ParityGateCallback:
        """A callback added to ``trainer`` that logs through ``trainer.log``."""
        callback = cls(config, trainer=trainer, **kwargs)
        trainer.add_callback(callback)
        return callback

    @classmethod
    def from_trainer(
        cls,
        trainer: _Trainer,
        *,
        prompts: Sequence[str] | None = None,
        folder: str | Path | None = None,
        name: str | None = None,
        checks: Sequence[str] | None = None,
        stop_on_fail: bool = False,
        timeout_s: float | None = None,
        bless_first: bool = False,
    ) -> ParityGateCallback:
        """Write the gate config from ``trainer`` (its arguments and dataset; see
        :func:`paritygate.integrations.configs.write_trl_config`: ``<output_dir>/paritygate/
        gate.yaml`` by default) and attach a callback gating with it (the other arguments are
        the callback's)."""
        from paritygate.integrations.configs import LM_CHECKS, write_trl_config

        config = write_trl_config(trainer.args, prompts=prompts, trainer=trainer, folder=folder,
                                  name=name, checks=checks or LM_CHECKS)
        return cls.attach(trainer, config, stop_on_fail=stop_on_fail, timeout_s=timeout_s,
                          bless_first=bless_first)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if not state.is_world_process_zero:
            return control
        output_dir = Path(args.output_dir)
        checkpoint = output_dir / f"checkpoint-{state.global_step}"
        try:
            outcome = gate_checkpoint(
                self.config, checkpoint, step=state.global_step,
                report_dir=output_dir / "paritygate" / checkpoint.name,
                checks=self.checks, timeout_s=self.timeout_s,
                bless_first=self.bless_first and not self.outcomes)
            self.outcomes.append(outcome)
            if self._tracker is None:
                self._tracker = TrackerFiles(output_dir / "paritygate")
            self._tracker.add(outcome)
        except Exception as exc:  # never crash training over the gate
            logger.warning(f"paritygate: {checkpoint.name}: the gate could not run: {exc}")
            if self.stop_on_fail:
                control.should_training_stop = True
            return control
        (logger.info if outcome.status == "pass" else logger.warning)(outcome.summary())
        if self.trainer is not None:
            self.trainer.log(dict(outcome.scalars))
        if self.stop_on_fail and outcome.failed:
            logger.warning("paritygate: stopping training (stop_on_fail)")
            control.should_training_stop = True
        return control
