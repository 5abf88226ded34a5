"""How a gate session ends, shared by ``paritygate run``'s own session
(:mod:`paritygate.runner`) and the pytest plugin: its :class:`Outcome`, each check's progress
line, and :func:`conclude`, which commits golden and writes the reports (or neither). Nothing
here imports pytest."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from paritygate.cli_signals import interrupts_deferred
from paritygate.errors import InputError, write_failed
from paritygate.result import CheckResult

if TYPE_CHECKING:
    from paritygate.gate import Gate
    from paritygate.report import WrittenReport

INTERRUPTED_LINE = (
    "interrupted: no report written; the previous report and golden baselines are unchanged"
)


@dataclass
class Outcome:
    """How a gate session ended: what the CLI turns into its exit code and stderr line.

    ``kind`` is the report's status (``pass``, ``fail``, ``nothing_verified``) or why no
    report was written: ``interrupted``, ``input_error``, ``usage_error``, ``collect_only``.
    """

    kind: str
    line: str | None = None
    written: WrittenReport | None = None
    not_run: list[str] = field(default_factory=list)


def progress_line(result: CheckResult) -> str:
    """The line printed as each check ends: status, id, seconds and its key metric."""
    key = result.key_metric
    value = result.metrics.get(key) if key else None
    shown = (f"{key}={value:.3g}" if isinstance(value, float)
             else (f"{key}={value}" if key else ""))
    return f"[paritygate] {result.status:>5}  {result.id:<22} {result.duration_s:6.2f}s  {shown}"


def verified_before(path: Path) -> bool:
    """An existing report.json that verified checks (status pass or fail)."""
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("status") in ("pass", "fail")
    except (OSError, ValueError, AttributeError):
        return False


def conclude(gate: Gate, results: list[CheckResult], out: Path, *,
             not_run: list[str] | None = None, hint: str = "") -> Outcome:
    """Decide the outcome of a session whose checks ran, then commit golden and write the
    reports into ``out`` (or neither, when nothing was verified and ``out`` holds an earlier
    report that verified checks). ``hint`` is added to a nothing-verified line."""
    from paritygate.report import (
        NOTHING_VERIFIED,
        nothing_verified_reason,
        overall_status,
        write_reports,
    )

    not_run = not_run or []
    order = {c.id: i for i, c in enumerate(gate.checks())}
    results = sorted(results, key=lambda r: order.get(r.id, 99))
    status = overall_status(results, allow_skips=gate.allow_skips)
    line = None
    if status == NOTHING_VERIFIED:
        line = nothing_verified_reason(results) + hint
    verified = any(r.status in ("pass", "fail", "error") for r in results)
    if not verified and verified_before(out / "report.json"):
        kept = f"; {out / 'report.json'} (an earlier run that verified checks) is kept"
        gate.discard_golden()
        return Outcome(status, (line or "nothing was verified") + kept, None, not_run)
    try:
        with interrupts_deferred():
            gate.commit_golden()
            written = write_reports(gate, results, out, not_run=not_run)
    except InputError as exc:
        return Outcome("input_error", exc.line())
    except OSError as exc:
        return Outcome("input_error", write_failed(exc, out, "report_dir").line())
    return Outcome(written.status, line, written, not_run)


def summary_lines(outcome: Outcome) -> list[str]:
    """What the session prints after its checks: the paritygate summary table and status, the
    checks a stopped run never reached, a nothing-verified line (the separator line is the
    caller's)."""
    lines: list[str] = []
    written = outcome.written
    if written is not None:
        from paritygate.report import summary_table

        lines += summary_table(written.results)
        lines.append(f"status: {written.status}   reports: {written.directory}")
    if outcome.not_run:
        lines.append(
            f"paritygate: not run (the run stopped early): {', '.join(outcome.not_run)}; "
            "the root cause is chosen among the checks that ran")
    if outcome.kind == "nothing_verified" or (outcome.line and written is None):
        lines.append(f"paritygate: {outcome.line}")
    return lines
