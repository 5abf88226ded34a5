"""Gate one saved checkpoint in a subprocess and turn the outcome into tracker numbers."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paritygate.report.tracker import EventFileWriter, append_jsonl, report_scalars

STATUS_BY_EXIT = {0: "pass", 1: "fail", 2: "input_error", 3: "nothing_verified"}


@dataclass
class GateOutcome:
    """What one gate of one checkpoint said."""

    checkpoint: Path
    step: int
    exit_code: int
    status: str
    """``pass``, ``fail``, ``nothing_verified``, ``input_error`` (exit 2), ``error`` (the
    subprocess could not run, timed out, or ended otherwise)."""
    line: str | None
    """The one-line cause of an exit 2 or an error, else ``None``."""
    root_cause_kind: str | None
    root_cause_check: str | None
    scalars: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    report_dir: Path | None = None
    blessed: bool = False
    """This gate blessed the run's first baseline (``bless_first``) and every check passed."""

    @property
    def failed(self) -> bool:
        """A gate that did not pass (fail, bad input, error, nothing verified)."""
        return self.status != "pass"

    def summary(self) -> str:
        """One line for the trainer's log."""
        head = f"paritygate: {self.checkpoint.name} (step {self.step}): {self.status}"
        if self.blessed:
            head += ", blessed as the run's golden baseline"
        if self.root_cause_kind:
            head += f", root cause {self.root_cause_check}: {self.root_cause_kind}"
        if self.line:
            head += f": {self.line}"
        if self.report_dir is not None and self.status in ("pass", "fail", "nothing_verified"):
            head += f" (reports in {self.report_dir})"
        return head + f" [{self.seconds:.1f} s]"

    def record(self) -> dict[str, Any]:
        """The JSON line: step, status, cause and the scalars."""
        return {"step": self.step, "checkpoint": str(self.checkpoint), "status": self.status,
                "exit_code": self.exit_code, "line": self.line,
                "root_cause_kind": self.root_cause_kind,
                "root_cause_check": self.root_cause_check, "seconds": self.seconds,
                "blessed": self.blessed, **self.scalars}


def gate_checkpoint(
    config: str | Path,
    checkpoint: str | Path,
    *,
    step: int,
    report_dir: str | Path,
    checks: list[str] | None = None,
    timeout_s: float | None = None,
    python: str = sys.executable,
    bless_first: bool = False,
) -> GateOutcome:
    """``paritygate run CONFIG --checkpoint CHECKPOINT --report-dir REPORT_DIR`` in a new
    process; never raises for what the gate says (bad input, an error, a timeout are outcomes).

    ``bless_first``: bless this checkpoint as the run's first baseline (``--bless-first --step
    STEP``); a baseline that exists is the gate's bad input (exit 2 naming the file)."""
    checkpoint, report_dir = Path(checkpoint), Path(report_dir)
    cmd = [python, "-m", "paritygate", "run", str(config), "--checkpoint", str(checkpoint),
           "--report-dir", str(report_dir)]
    if bless_first:
        cmd += ["--bless-first", "--step", str(step)]
    for cid in checks or []:
        cmd += ["--check", cid]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        why = f"timed out after {timeout_s} s" if isinstance(exc, subprocess.TimeoutExpired) \
            else f"could not start: {exc}"
        return GateOutcome(checkpoint, step, -1, "error", f"paritygate run {why}", None, None,
                           {"paritygate/passed": 0.0}, time.perf_counter() - start, report_dir)
    seconds = time.perf_counter() - start
    status = STATUS_BY_EXIT.get(proc.returncode, "error")
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    line = lines[-1] if status in ("input_error", "error") and lines else None
    report_path = report_dir / "report.json"
    report: dict[str, Any] = {}
    if status in ("pass", "fail", "nothing_verified") and report_path.is_file():
        report = json.loads(report_path.read_text(encoding="utf-8"))
    cause = report.get("root_cause") or {}
    scalars = report_scalars(report) if report else {"paritygate/passed": 0.0}
    scalars["paritygate/exit_code"] = float(proc.returncode)
    scalars["paritygate/seconds"] = seconds
    return GateOutcome(checkpoint, step, proc.returncode, status, line, cause.get("kind"),
                       cause.get("check"), scalars, seconds, report_dir,
                       blessed=bless_first and status == "pass")


class TrackerFiles:
    """``metrics.jsonl`` and a TensorBoard event file in one folder, one entry per gate."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.jsonl = self.folder / "metrics.jsonl"
        self._events: EventFileWriter | None = None

    def add(self, outcome: GateOutcome) -> None:
        append_jsonl(self.jsonl, outcome.record())
        if self._events is None:
            self._events = EventFileWriter(self.folder)
        self._events.add_scalars(outcome.scalars, outcome.step)
