"""``ParityGateCallback``: gate every policy a Stable-Baselines3 run saves.

::

    from stable_baselines3.common.callbacks import CallbackList, CheckpointCallback
    from paritygate.integrations.sb3 import ParityGateCallback

    saves = CheckpointCallback(save_freq=10_000, save_path="ckpts", name_prefix="ppo")
    model.learn(100_000, callback=CallbackList(
        [saves, ParityGateCallback("configs/ppo.yaml", save_path="ckpts")]))

Placed after a ``CheckpointCallback`` it gates each new ``.zip`` in ``save_path`` the step it
appears; as ``EvalCallback(callback_on_new_best=ParityGateCallback(config))`` it gates
``best_model.zip``. Each gate is ``paritygate run CONFIG --checkpoint <zip>`` in a subprocess;
numbers go through SB3's logger, reports to ``<save_path>/paritygate/<zip stem>/``, and
``metrics.jsonl`` with a TensorBoard event file to ``<save_path>/paritygate/``. Bad input or an
error is logged with its one line and training goes on unless ``stop_on_fail``.

``bless_first=True`` blesses the first zip gated as the run's baseline (``paritygate run
--bless-first --step N``; never over an existing one: that gate is bad input naming the file),
and :meth:`ParityGateCallback.for_model` writes the config from the model object before the
first save (``<save_path>/paritygate/gate.yaml``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from stable_baselines3.common.callbacks import BaseCallback

from paritygate.integrations.common import GateOutcome, TrackerFiles, gate_checkpoint
from paritygate.integrations.configs import SB3Model

__all__ = ["ParityGateCallback"]


class ParityGateCallback(BaseCallback):  # type: ignore[misc]
    """Gates each checkpoint an SB3 run saves (see the module docstring)."""

    def __init__(
        self,
        config: str | Path,
        *,
        save_path: str | Path | None = None,
        stop_on_fail: bool = False,
        checks: list[str] | None = None,
        timeout_s: float | None = None,
        verbose: int = 1,
        bless_first: bool = False,
    ) -> None:
        super().__init__(verbose)
        self.config = Path(config).resolve()
        self.save_path = Path(save_path) if save_path is not None else None
        self.stop_on_fail = stop_on_fail
        self.checks = checks
        self.timeout_s = timeout_s
        self.bless_first = bless_first
        self.outcomes: list[GateOutcome] = []
        self._seen: set[Path] = set()
        self._trackers: dict[Path, TrackerFiles] = {}

    @classmethod
    def for_model(
        cls,
        model: SB3Model,
        save_path: str | Path,
        *,
        folder: str | Path | None = None,
        name: str | None = None,
        checks: Sequence[str] | None = None,
        probes: object = None,
        artifact: str | Path | None = None,
        stop_on_fail: bool = False,
        timeout_s: float | None = None,
        verbose: int = 1,
        bless_first: bool = False,
    ) -> ParityGateCallback:
        """Write the gate config from ``model`` (its algorithm, spaces, network and environment;
        see :func:`paritygate.integrations.configs.write_sb3_config`) and return a callback
        gating the zips saved into ``save_path`` with it (the other arguments are the
        callback's)."""
        from paritygate.integrations.configs import POLICY_CHECKS, write_sb3_config

        config = write_sb3_config(model, save_path, folder=folder, name=name,
                                  checks=checks or POLICY_CHECKS, probes=probes,
                                  artifact=artifact)
        return cls(config, save_path=save_path, stop_on_fail=stop_on_fail, timeout_s=timeout_s,
                   verbose=verbose, bless_first=bless_first)

    def _new_checkpoints(self) -> list[Path]:
        best_dir = getattr(self.parent, "best_model_save_path", None)
        if self.save_path is None and best_dir is not None:  # callback_on_new_best
            return [Path(best_dir) / "best_model.zip"]
        if self.save_path is None or not self.save_path.is_dir():
            return []
        fresh = [p for p in self.save_path.glob("*.zip") if p not in self._seen]
        self._seen.update(fresh)
        return sorted(fresh, key=lambda p: p.stat().st_mtime)

    def _on_step(self) -> bool:
        keep_going = True
        for checkpoint in self._new_checkpoints():
            keep_going &= self._gate(checkpoint)
        return keep_going

    def _gate(self, checkpoint: Path) -> bool:
        folder = checkpoint.parent / "paritygate"
        try:
            outcome = gate_checkpoint(
                self.config, checkpoint, step=int(self.num_timesteps),
                report_dir=folder / checkpoint.stem, checks=self.checks,
                timeout_s=self.timeout_s, bless_first=self.bless_first and not self.outcomes)
            self.outcomes.append(outcome)
            self._trackers.setdefault(folder, TrackerFiles(folder)).add(outcome)
        except Exception as exc:  # never crash training over the gate
            print(f"paritygate: {checkpoint.name}: the gate could not run: {exc}")
            return not self.stop_on_fail
        if self.verbose:
            print(outcome.summary())
        for key, value in outcome.scalars.items():
            self.logger.record(key, value)
        if outcome.root_cause_kind:
            self.logger.record("paritygate/root_cause", outcome.root_cause_kind,
                               exclude=("tensorboard",))
        self.logger.dump(self.num_timesteps)
        return not (self.stop_on_fail and outcome.failed)
