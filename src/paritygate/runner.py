"""``paritygate run``'s own session, for runs that ask nothing of pytest (no ``-m``, no
workers): the selected checks through :meth:`Gate.evaluate <paritygate.gate.Gate.evaluate>`
in checklist order, then :func:`paritygate.session.conclude`, as the pytest plugin's session
does with the gate files, without importing pytest (a tenth of a small gate's process).

What it prints follows a pytest session of the gate files: a progress line per check, the
paritygate summary, the counts line; and, as pytest captures it, what a check itself writes
to stdout or stderr (a library's log) is not shown.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path
from typing import TYPE_CHECKING

from paritygate.errors import InputError
from paritygate.files import json_default
from paritygate.result import CheckResult
from paritygate.session import Outcome, conclude, progress_line, summary_lines

if TYPE_CHECKING:
    from paritygate.gate import Gate


def run_checks(gate: Gate, out: Path) -> Outcome:
    """Evaluate the gate's checks (those the run names, when it names some), print their
    progress and the summary, and conclude: golden committed and reports written into
    ``out``, or bad input (the session stops at the check that found it, nothing written)."""
    from paritygate.checks import CHECK_IDS

    start = time.perf_counter()
    specs = [c for c in gate.checks() if not gate.named or c.id in gate.named]
    results: list[CheckResult] = []
    try:
        for spec in specs:
            try:
                with _captured():
                    result = gate.evaluate(spec.id)
            except InputError as exc:
                gate.discard_golden()
                return Outcome("input_error", exc.line())
            # as a result travels through the pytest session: the report reads the same copy
            result = CheckResult.from_json(json.loads(json.dumps(result.to_json(),
                                                                 default=json_default)))
            results.append(result)
            print(progress_line(result), flush=True)
    finally:
        _close(gate)
    outcome = conclude(gate, results, out)
    lines = summary_lines(outcome)
    if outcome.written is not None:
        lines[:0] = ["", _separator("paritygate")]
    offered = len(gate.named) if gate.named else len(CHECK_IDS)
    lines.append(_counts(results, offered - len(specs), time.perf_counter() - start))
    print("\n".join(lines), flush=True)
    return outcome


def _close(gate: Gate) -> None:
    """Stop the engines the gate started (vLLM's processes) before the summary, as the
    plugin does at the end of its session; a failed shutdown does not cost the verdict."""
    try:
        gate.close()
    except Exception as exc:
        sys.stderr.write(f"paritygate: could not shut down {gate.config.name}'s engines: "
                         f"{type(exc).__name__}: {exc}\n")


@contextmanager
def _captured() -> Iterator[None]:
    """What a check writes (a library's warnings and logs) goes to a discarded file, as
    pytest's capture would hold it: file descriptors 1 and 2, and ``sys.stdout`` and
    ``sys.stderr`` too, which need not write to them (the CLI called in-process with its
    streams replaced)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile() as sink, \
            open(sink.fileno(), "w", encoding="utf-8", errors="replace", closefd=False) as text:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            with redirect_stdout(text), redirect_stderr(text):
                yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def _separator(title: str) -> str:
    """A titled separator line as wide as the terminal (pytest's ``write_sep``)."""
    width = max(shutil.get_terminal_size(fallback=(80, 24)).columns, 40)
    fill = "=" * max((width - len(title) - 2) // 2, 1)
    line = f"{fill} {title} {fill}"
    return line + "=" if len(line) + 1 <= width else line


def _counts(results: list[CheckResult], deselected: int, seconds: float) -> str:
    """The closing counts line, as pytest words it for the gate files: an ``error`` result
    fails its gate test, so it counts as failed."""
    failed = sum(r.status in ("fail", "error") for r in results)
    passed = sum(r.status == "pass" for r in results)
    skipped = sum(r.status == "skip" for r in results)
    parts = [f"{n} {word}" for n, word in ((failed, "failed"), (passed, "passed"),
                                          (skipped, "skipped"), (deselected, "deselected"))
             if n]
    return f"{', '.join(parts) or 'no tests ran'} in {seconds:.2f}s"
