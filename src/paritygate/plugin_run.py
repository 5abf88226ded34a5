"""One gate session's state under pytest (:class:`GateRun`, kept in the config's stash) and
how it ended (:class:`Outcome`); :mod:`paritygate.plugin` holds the hooks."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from paritygate.errors import InputError, shorten
from paritygate.result import CheckResult
from paritygate.session import Outcome, progress_line, verified_before

if TYPE_CHECKING:
    from paritygate.gate import Gate

__all__ = [
    "INPUT_ERROR_KEY", "RESULT_KEY", "RUN", "STATUS_KEY", "GateRun", "Outcome", "check_id_of",
    "marker_hint", "state", "verified_before",
]

RESULT_KEY = "paritygate_result"
"""user_properties entry carrying a check's result from an xdist worker to the controller;
the controller swaps it for a short ``paritygate_status`` entry (junit.xml stays small)."""
STATUS_KEY = "paritygate_status"
INPUT_ERROR_KEY = "paritygate_input_error"


class GateRun:
    """State of one gate session, kept in ``config.stash[RUN]`` (never in module globals).

    A caller that already built the :class:`~paritygate.gate.Gate` (the CLI validates every
    input first) hands one in, ``pytest.main(args, plugins=[GateRun(gate)])``, and reads
    :attr:`outcome` when the run returns. Otherwise :func:`pytest_configure` makes one.
    """

    def __init__(self, gate: Gate | None = None, *, owns_stderr: bool = False) -> None:
        self.gates: dict[str, Gate] = {}
        if gate is not None:
            self.gates[str(gate.config.path)] = gate
        self.owns_stderr = owns_stderr
        """The caller prints the one stderr line itself (from :attr:`outcome`)."""
        self.input_errors: dict[str, InputError] = {}
        self.results: list[CheckResult] = []
        self.bad_input: list[str] = []
        self.selected: list[str] = []
        """Check ids of the gate items left after selection, in run order."""
        self.notice: str | None = None
        self.outcome: Outcome | None = None
        self.config: pytest.Config | None = None
        self.interrupted = False
        """A KeyboardInterrupt (SIGINT, SIGTERM) reached the session: whatever exit status
        pytest ends with, the run verified nothing it can report."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        """Note the interrupt before any other plugin's hook can fail on it (pytest's own
        terminal reporter may raise formatting the interrupted frame, and the session then
        finishes with exit status 0). A session stopped on purpose (bad input found while a
        check runs: ``session.shouldstop``, ``pytest.exit``) is not one."""
        stopped = isinstance(excinfo.value, pytest.Session.Interrupted)
        if isinstance(excinfo.value, KeyboardInterrupt) and not stopped:
            self.interrupted = True

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Collect each check's result (the controller's copy under xdist), and swap the
        result JSON in ``user_properties`` for its status before ``--junitxml`` reads it."""
        if self.config is not None and hasattr(self.config, "workerinput"):
            return  # an xdist worker sends the result JSON on to the controller
        found = False
        for n, (name, value) in enumerate(report.user_properties):
            if name == RESULT_KEY:
                result = CheckResult.from_json(json.loads(str(value)))
                report.user_properties[n] = (STATUS_KEY, result.status)
                found = True
                if report.when == "call":
                    self.results.append(result)
                    self._progress(result)
            elif name == INPUT_ERROR_KEY:
                found = True
                if str(value) not in self.bad_input:
                    self.bad_input.append(str(value))
        check_id = check_id_of(report.nodeid)
        if report.failed and not found and check_id is not None and report.when != "teardown":
            # A gate test that failed without recording a result (a crash around the check):
            # never counted as verified, so --allow-skips cannot turn it into a pass.
            why = str(report.longrepr).strip().splitlines()[-1:] or ["no result"]
            self.results.append(CheckResult(
                check_id, "error", f"the check ended without a result: {shorten(why[0], 300)}",
                {}, None, {}))

    def _progress(self, result: CheckResult) -> None:
        tr = self.config.pluginmanager.get_plugin("terminalreporter") if self.config else None
        if tr is not None:
            tr.write_line(progress_line(result))


RUN = pytest.StashKey[GateRun]()
"""Where a session's :class:`GateRun` lives."""


def state(config: pytest.Config) -> GateRun:
    return config.stash[RUN]


def check_id_of(nodeid: str) -> str | None:
    """The check a gate file's test node evaluates (``test_<id>`` in ``paritygate_gates``)."""
    from paritygate.checks import CHECK_IDS

    name = nodeid.rsplit("::", 1)[-1].removeprefix("test_")
    return name if name in CHECK_IDS and "::test_" in nodeid else None


def marker_hint(config: pytest.Config) -> str:
    """``-m`` naming no registered marker says so and lists them (as --strict-markers does)."""
    import re

    expr = config.getoption("markexpr", "") or ""
    names = set(re.findall(r"[A-Za-z_][\w.-]*", expr)) - {"and", "or", "not"}
    known = sorted({line.split(":")[0].split("(")[0].strip()
                    for line in config.getini("markers")})
    unknown = sorted(names - set(known))
    if not unknown:
        return ""
    return f"; -m names no marker {', '.join(unknown)}: markers are {', '.join(known)}"
