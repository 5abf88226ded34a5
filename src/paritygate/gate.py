"""The gate: one config, one loaded context, every check measured and judged the same way.

The CLI, the pytest plugin and the gate files all go through :class:`Gate`:
``Gate.evaluate(check_id)`` measures (the family context is built once, lazily)
and hands the measurement to :func:`paritygate.golden.regression_check`, which
judges it against thresholds and golden and runs the baseline's life cycle.
"""

from __future__ import annotations

import hashlib
import os
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paritygate.check import CheckSpec, Thresholds, needs_of, selects_by_marks
from paritygate.checks import checks_for, get_check
from paritygate.config import GateConfig
from paritygate.errors import InputError, NonFiniteOutput, write_failed
from paritygate.files import unwritable_reason
from paritygate.golden import BlessInProgress, GoldenStore, regression_check
from paritygate.load import load_config
from paritygate.provenance import environment
from paritygate.records import Record
from paritygate.result import CheckResult, Measurement
from paritygate.startup import IMPORTED_AT
from paritygate.verdict import Margin, judge

if TYPE_CHECKING:
    from paritygate.families.base import Context
    from paritygate.threads import ThreadPlan


@dataclass(frozen=True)
class GateError(Record):
    """The last frames of a check that raised (its result's status is ``error``)."""

    traceback: str


class Gate:
    """A gate run over one config."""

    def __init__(
        self,
        config: GateConfig,
        *,
        update_golden: bool = False,
        report_dir: str | Path | None = None,
    ) -> None:
        self.config = config
        if report_dir is not None:  # where reports and an on-the-fly export go
            config.set_report_dir(report_dir)
        self.update_golden = update_golden
        self.allow_skips = False
        """A run whose every check skipped passes only with this opt-in (``--allow-skips``)."""
        self.command = "run"
        """The ``paritygate`` subcommand running this gate, named in the bless command."""
        self.golden = GoldenStore(config.golden_dir())
        self.startup_s: float | None = None
        """Seconds from importing paritygate to the built context: what a new process repeats."""
        self.threads: ThreadPlan | None = None
        """The intra-op thread counts set when the context was built, and why."""
        self.margin = Margin(config.golden.rel_margin, config.golden.threshold_fraction)
        self.markexpr: str | None = None
        """The run's ``-m`` expression (the plugin sets it): see :meth:`asked_for`."""
        self.named: frozenset[str] = frozenset()
        """Check ids the run named (``paritygate run --check``, a gate file given to pytest)."""

    @classmethod
    def from_path(
        cls,
        path: str | Path,
        *,
        update_golden: bool = False,
        report_dir: str | Path | None = None,
        checkpoint: str | int | None = None,
    ) -> Gate:
        """The gate of a config file; ``checkpoint`` is ``paritygate run --checkpoint``: a step
        of the trainer output_dir the config names, ``latest``, ``final`` or a path."""
        config = load_config(path)
        if checkpoint is not None:
            from paritygate.config import apply_checkpoint

            config = apply_checkpoint(config, str(checkpoint))
        return cls(config, update_golden=update_golden, report_dir=report_dir)

    @cached_property
    def needs(self) -> frozenset[str]:
        """What the family builds for this run: the needs (:attr:`CheckSpec.needs`) of the
        checks the run names (``--check``), else of every check of the family. A run that needs
        nothing that loads (only :attr:`~paritygate.check.CheckSpec.config_only` checks) gets
        the family's config-only context: no model runs, so no thread plan either."""
        named = [get_check(c) for c in sorted(self.named)]
        return needs_of(named or checks_for(self.config.family))

    @cached_property
    def context(self) -> Context:
        """The family context for :attr:`needs`, built once; raises :class:`InputError` on bad
        input."""
        from paritygate.families import build_context

        if self.needs:
            from paritygate.threads import apply_threads

            self.threads = apply_threads(self.config.threads)
        context = build_context(self.config, needs=self.needs)
        self.startup_s = time.perf_counter() - IMPORTED_AT
        return context

    def check_writable(self, report_dir: Path | None = None) -> None:
        """The report and golden folders must be creatable and writable: checked before any
        check runs, so a run never measures everything and then fails to write. Decided on the
        resolved paths: a link onto a read-only mount or a missing folder is caught here."""
        targets = [
            (report_dir or self.config.default_report_dir(), "report_dir"),
            (self.golden.directory, "golden.dir"),
        ]
        for target, key in targets:
            why = unwritable_reason(Path(target))
            if why is not None:
                raise InputError(target, key, f"cannot write here: {why}")

    def begin_bless(self) -> None:
        """With ``--update-golden``, lock the baseline folder for this run (see
        :class:`~paritygate.golden.GoldenStore`): a second blesser of the same folder is
        refused before any check runs. :meth:`commit_golden` writes and unlocks."""
        if not self.update_golden:
            return
        try:
            self.golden.begin()
        except BlessInProgress as exc:
            raise InputError(self.golden.directory, "golden.dir", str(exc)) from None
        except OSError as exc:
            raise write_failed(exc, self.golden.lock_path, "golden.dir") from None

    def commit_golden(self) -> None:
        """Write the baselines this run blessed (a no-op outside a bless)."""
        try:
            self.golden.commit()
        except OSError as exc:
            raise write_failed(exc, self.golden.directory, "golden.dir") from None

    def discard_golden(self) -> None:
        """Forget what this run blessed (interrupted, or stopped by bad input)."""
        self.golden.discard()

    def close(self) -> None:
        """Shut down what the context started (a vLLM engine and its processes); the gate
        files' session calls it when the run ends. A context without engines to stop has
        no ``close``."""
        close = getattr(self.__dict__.get("context"), "close", None)
        if callable(close):
            close()

    def checks(self) -> list[CheckSpec]:
        """Checks this gate runs, in checklist order."""
        selected = checks_for(self.config.family)
        if self.config.checks is not None:
            wanted = set(self.config.checks)
            selected = [c for c in selected if c.id in wanted]
        return [c for c in selected if c.id not in self.config.skip_checks]

    def asked_for(self, spec: CheckSpec) -> bool:
        """The run asks for this check by name (``--check``, the config's ``checks:``) or by
        its own marks (``-m vllm``). A check with :attr:`~paritygate.check.CheckSpec.unasked`
        runs when its config or the run asks for it, and is skipped saying why otherwise."""
        listed = self.config.checks is not None and spec.id in self.config.checks
        return listed or spec.id in self.named or selects_by_marks(self.markexpr, spec.marks)

    def thresholds(self, spec: CheckSpec) -> Thresholds:
        """The check's defaults and the config's overrides, kept apart (see :class:`Thresholds`);
        the only place that reads ``thresholds.<check>`` of the config."""
        return Thresholds(spec.defaults, dict(self.config.thresholds.get(spec.id, {})))

    def measure(self, check_id: str) -> Measurement:
        """Run one check's measurement (no verdict)."""
        spec = get_check(check_id)
        measure = spec.measures.get(self.config.family)
        if measure is None:
            return Measurement(check_id).skip(
                f"{check_id} does not apply to the {self.config.family!r} family"
            )
        if spec.unasked is not None and not self.asked_for(spec):
            unasked = spec.unasked(self.context)
            if unasked is not None:
                return Measurement(check_id).skip(unasked)
        unmet = set(spec.needs) - self.needs
        if unmet:  # the context was built for a selection without this check
            runs = ", ".join(sorted(self.named))
            raise RuntimeError(f"{check_id} needs {', '.join(sorted(unmet))}, which this run's "
                               f"context was not built with (it runs {runs})")
        thresholds = self.thresholds(spec)
        try:
            measurement = measure(self.context, thresholds)
        except NonFiniteOutput as exc:  # a model's NaN/Inf output fails the check by name
            measurement = Measurement(check_id)
            measurement.fail("nonfinite_output", str(exc))
        if spec.feeds_probes and measurement.skipped is None:
            self.context.note_probes(measurement)  # probe rows left out of the inputs, and why
        for name, metric in measurement.metrics.items():  # ``null``: not judged
            if {name, metric.limit_key} & thresholds.informational:
                measurement.metrics[name] = replace(metric, threshold=None)
        return measurement

    def provenance(self) -> dict[str, Any]:
        ctx = self.context
        # Hash of the validated config, so comments and formatting do not count as changes;
        # the thread count is where the gate runs, not what it checks.
        dumped = self.config.model_dump_json(exclude={"threads"},
                                             context={"base_dir": self.config.base_dir})
        config_hash = hashlib.sha256(dumped.encode()).hexdigest()
        return {
            "checkpoint_sha256": ctx.checkpoint_sha256,
            "probes_sha256": ctx.probes_sha256,
            "config_sha256": config_hash,
            "numerics": self.numerics(),
            **({"trainer": self.config.trainer_checkpoint.to_json()}
               if self.config.trainer_checkpoint is not None else {}),
            "bless_command": self.bless_command(),
            **self._blessed_first(),
            "environment": environment(),
        }

    def _blessed_first(self) -> dict[str, object]:
        """``{"blessed_first": {"step", "checkpoint"}}`` when ``run --bless-first`` (or a
        callback's ``bless_first``) blessed the first checkpoint of a run."""
        import json

        from paritygate.trainer_output import BLESS_FIRST_ENV

        raw = os.environ.get(BLESS_FIRST_ENV)
        if not raw or not self.update_golden:
            return {}
        step = json.loads(raw).get("step")
        record = self.config.trainer_checkpoint  # a checkpoint-N folder, else the file
        gated = record.path if record is not None else Path(self.context.checkpoint_path)
        return {"blessed_first": {"step": step, "checkpoint": gated.name}}

    def numerics(self) -> dict[str, Any]:
        """The context's settings that move numbers by design (empty for families without)."""
        return dict(self.context.numerics)

    def bless_command(self) -> str:
        try:
            cfg = self.config.path.relative_to(Path.cwd())
        except ValueError:
            cfg = self.config.path
        return f"paritygate {self.command} {cfg} --update-golden"

    def evaluate(self, check_id: str, *, golden: bool = True) -> CheckResult:
        """Measure one check, then judge it: against thresholds only (``golden=False``) or
        through the golden life cycle of :func:`paritygate.golden.regression_check`.

        Bad input propagates as :class:`InputError`, and so does a golden file that cannot
        be written (naming the path and the OS error); any other exception of the
        measurement becomes an ``error`` result carrying the traceback's last line.
        """
        start = time.perf_counter()
        try:
            measurement = self.measure(check_id)
        except InputError as exc:  # a file read mid-check names its config key too
            raise self.config.key_error(exc) from None
        except Exception as exc:  # a check crashing is a gate error, reported by name
            tb = traceback.format_exc(limit=-3)
            return CheckResult(
                check_id,
                "error",
                f"{type(exc).__name__}: {exc}",
                {},
                None,
                {},
                details=GateError(tb).to_json(),
                duration_s=time.perf_counter() - start,
            )
        if golden:
            try:
                result = self._regression_check(measurement)
            except OSError as exc:  # a golden file that cannot be written is no verdict
                raise write_failed(exc, self.golden.directory, "golden.dir") from None
        else:
            result = judge(measurement, None, margin=self.margin, use_golden=False)
        result.duration_s = time.perf_counter() - start
        return result

    def _regression_check(self, measurement: Measurement) -> CheckResult:
        return regression_check(
            measurement,
            self.golden,
            margin=self.margin,
            blessing=self.update_golden,
            probes_sha256=lambda: self.context.probes_sha256,
            provenance=self.provenance,
            numerics=self.numerics,
            bless_command=self.bless_command(),
        )

    def run(self, select: Mapping[str, bool] | None = None) -> list[CheckResult]:
        """Evaluate every applicable check (``select`` maps id -> run?)."""
        return [self.evaluate(c.id) for c in self.checks() if select is None or select.get(c.id)]
