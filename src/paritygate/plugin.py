"""pytest plugin: the gate files call ``gate_check(check_id)``; results become report artifacts.

Registered through the ``pytest11`` entry point. With ``-n N`` the controller first
decides whether workers can shorten the run (:mod:`paritygate.workers`) and runs
serially when they cannot. Under pytest-xdist each worker builds its own
:class:`~paritygate.gate.Gate`; results travel to the controller in
``user_properties`` and the controller alone writes the report, so the verdict is
the same with or without ``-n``.
"""

from __future__ import annotations

import gc
import json
import os
import sys
from collections.abc import Callable, Generator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from paritygate.errors import InputError
from paritygate.files import json_default
from paritygate.plugin_run import (
    INPUT_ERROR_KEY,
    RESULT_KEY,
    RUN,
    STATUS_KEY,
    GateRun,
    Outcome,
    check_id_of,
    marker_hint,
    state,
)
from paritygate.result import CheckResult
from paritygate.session import INTERRUPTED_LINE, conclude, summary_lines

if TYPE_CHECKING:
    from typing import Protocol

    import pluggy

    class HasConfig(Protocol):
        """An xdist worker controller, as far as the plugin reads it."""

        config: pytest.Config

    from paritygate.gate import Gate

EXIT_NOTHING_VERIFIED = pytest.ExitCode.NO_TESTS_COLLECTED
"""Under pytest, a run that verified nothing (every selected check skipped, or none
selected) ends like a run that collected nothing: 5. ``paritygate run`` says 3."""
EXIT_STOPPED = pytest.ExitCode.USAGE_ERROR
"""Under pytest, bad input (or a report or golden file that cannot be written) ends with
pytest's usage-error code, 4, and one line on stderr. ``paritygate run`` says 2."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("paritygate", "paritygate release gate")
    group.addoption(
        "--gate-config",
        default=os.environ.get("PARITYGATE_CONFIG"),
        help="gate config YAML (env PARITYGATE_CONFIG)",
    )
    group.addoption(
        "--report-dir",
        default=None,
        help="where report.json/.md/.html and junit.xml go (default reports/<name>)",
    )
    group.addoption("--report-format", default=None, help="report files, comma-separated from "
                    "json,md,html,junit (default: the config's report_formats)")
    group.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="bless the obtained metrics as the new golden baselines",
    )
    group.addoption(
        "--allow-skips",
        action="store_true",
        default=False,
        help="let a run in which every selected check skipped pass (exit 0 instead of 3)",
    )
    group.addoption(
        "--force-workers",
        action="store_true",
        default=False,
        help="start the -n workers even where paritygate estimates they cannot shorten the run",
    )


def pytest_configure(config: pytest.Config) -> None:
    for line in (
        "fast: quick checks, run on every artifact",
        "slow: expensive checks",
        "vllm: needs vLLM (its CPU build or CUDA): vllm_delta",
        "gpu: the vllm mark's earlier name, kept so -m gpu still selects the vLLM checks",
    ):
        config.addinivalue_line("markers", line)
    handed = [p for p in config.pluginmanager.get_plugins() if isinstance(p, GateRun)]
    run = handed[0] if handed else GateRun()
    if not handed:
        config.pluginmanager.register(run, "paritygate-run")
    config.stash[RUN] = run
    run.config = config
    if _xdist_requested(config):
        _plan_workers(config)


def _xdist_requested(config: pytest.Config) -> bool:
    """A gate session on the xdist controller with workers asked for (``-n N``)."""
    return (
        not hasattr(config, "workerinput")
        and bool(config.getoption("--gate-config"))
        and config.getoption("dist", "no") != "no"
        and bool(config.getoption("tx", None))
        and not config.getoption("collectonly", False)
        and not config.getoption("--force-workers")
    )


def _plan_workers(config: pytest.Config) -> None:
    """Run serially when workers cannot shorten the run (see :mod:`paritygate.workers`).

    Runs before pytest-xdist's own ``pytest_configure`` (``trylast``) starts any worker.
    The controller builds the gate here, as it would for the report anyway, and the
    serial checks then reuse it.
    """
    from paritygate.workers import WorkerPlan, idle_cores, plan_workers, previous_durations

    try:
        gate = _get_gate(config)
    except InputError:
        plan = WorkerPlan(0)  # the first check reports the bad input, once
    else:
        out = _report_dir(config, gate)
        plan = plan_workers(
            len(config.getoption("tx")),
            gate.startup_s or 0.0,
            previous_durations(out / "report.json", gate.config.name),
            out,
            idle_cores(),
        )
    if plan.workers == 0:
        config.option.dist = "no"
        config.option.tx = []
        config.option.numprocesses = 0
        state(config).notice = plan.notice


def _report_dir(config: pytest.Config, gate: Gate) -> Path:
    report_dir = config.getoption("--report-dir")
    return Path(report_dir) if report_dir else gate.config.default_report_dir()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect gate files whose check does not apply to the configured family.

    A config that does not load is a usage error, said once before any test runs."""
    path = config.getoption("--gate-config")
    gate_items = [i for i in items if "gate_check" in getattr(i, "fixturenames", ())]
    if not path or not gate_items:
        return
    from paritygate.gate import Gate

    try:
        wanted = {c.id for c in Gate.from_path(path).checks()}
    except InputError as exc:
        if hasattr(config, "workerinput"):
            return  # the controller says it (the first check reports it, once)
        raise pytest.UsageError(f"paritygate: error: {exc.line()}") from None
    drop = [i for i in gate_items if i.name.removeprefix("test_") not in wanted]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = [i for i in items if i not in drop]
    from paritygate.checks import CHECK_IDS

    order = {f"test_{cid}": n for n, cid in enumerate(CHECK_IDS)}
    items.sort(key=lambda i: order.get(i.name, -1) if i in gate_items else -1)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Remember which checks were selected (after ``-m``/``-k``), to name those a stopped
    run (``-x``, ``--maxfail``) never reached."""
    state(session.config).selected = [
        cid for cid in (check_id_of(i.nodeid) for i in session.items) if cid is not None
    ]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: HasConfig, ids: list[str]) -> None:
    """The controller's view of the selection under pytest-xdist (workers collect)."""
    run = state(node.config)
    if not run.selected:
        run.selected = [cid for cid in (check_id_of(i) for i in ids) if cid is not None]


def pytest_report_teststatus(
    report: pytest.TestReport, config: pytest.Config
) -> tuple[str, str, str] | None:
    """Gate checks print their own progress line; keep pytest's status letters out of it
    (the word stays, so the short summary still reads ``FAILED <test>``)."""
    if report.when == "call" and any(
        k in (RESULT_KEY, STATUS_KEY) for k, _ in report.user_properties
    ):
        return report.outcome, "", report.outcome.upper()
    return None


def _get_gate(config: pytest.Config) -> Gate:
    from paritygate.gate import Gate

    run = state(config)
    path = config.getoption("--gate-config")
    if not path:
        raise InputError(None, "--gate-config", "no gate config given (or set PARITYGATE_CONFIG)")
    key = str(Path(path).resolve())
    if key in run.input_errors:
        raise run.input_errors[key]
    if key not in run.gates:
        try:
            report_dir = config.getoption("--report-dir")
            gate = Gate.from_path(
                path,
                update_golden=config.getoption("--update-golden"),
                report_dir=report_dir,
            )
            gate.check_writable(Path(report_dir) if report_dir else None)
            if config.getoption("--report-format") is not None:
                gate.config.set_report_formats(config.getoption("--report-format"))
            if not hasattr(config, "workerinput"):
                gate.begin_bless()  # xdist workers bless under their controller's lock
            gate.context  # noqa: B018 - build and validate every input once
        except InputError as exc:
            run.input_errors[key] = exc
            raise
        run.gates[key] = gate
    gate = run.gates[key]
    gate.update_golden = config.getoption("--update-golden")
    gate.allow_skips = config.getoption("--allow-skips")
    gate.markexpr = config.getoption("markexpr", "") or None
    gate.named = _named_checks(config.args)
    return gate


def _named_checks(args: list[str]) -> frozenset[str]:
    """Check ids the command line names: a gate file (``test_<id>.py``) or its test node
    (``paritygate run --check`` passes those)."""
    from paritygate.checks import CHECK_IDS

    named = set()
    for arg in args:
        name = Path(arg.split("::", 1)[0]).name
        cid = name.removeprefix("test_").removesuffix(".py")
        if name.startswith("test_") and name.endswith(".py") and cid in CHECK_IDS:
            named.add(cid)
    return frozenset(named)


@pytest.fixture(scope="session")
def paritygate_gate(pytestconfig: pytest.Config) -> Gate:
    """The :class:`~paritygate.gate.Gate` for ``--gate-config``."""
    return _get_gate(pytestconfig)


@pytest.fixture
def gate_check(request: pytest.FixtureRequest) -> Callable[[str], CheckResult]:
    """``gate_check(check_id)``: evaluate one check; fail or skip the test by its verdict.

    Bad input ends the session after this test (``session.shouldstop``): it is said once,
    as one line, not once per remaining check."""

    def run(check_id: str) -> CheckResult:
        bad: str | None = None
        try:
            result = _get_gate(request.config).evaluate(check_id)
        except InputError as exc:
            bad = exc.line()
        if bad is not None:
            request.node.user_properties.append((INPUT_ERROR_KEY, bad))
            request.session.shouldstop = "paritygate: bad input (the error line says which)"
            pytest.fail("bad input: see the paritygate error line", pytrace=False)
        payload = json.dumps(result.to_json(), default=json_default)
        request.node.user_properties.append((RESULT_KEY, payload))
        if result.status == "skip":
            pytest.skip(result.message)
        if result.status != "pass":
            pytest.fail(f"{check_id} {result.status}: {result.message}", pytrace=False)
        return result

    return run


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pluggy.Result[pytest.TestReport], None]:
    """A failing check's cause is printed once, in the paritygate summary; pytest's failure
    section points there and its short summary keeps the plain ``FAILED <test>`` line."""
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        for name, value in report.user_properties:
            if name == RESULT_KEY:
                check_id = json.loads(str(value)).get("id", item.name.removeprefix("test_"))
                report.longrepr = f"{check_id}: the cause is in the paritygate summary below"


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    notice = state(session.config).notice
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    if notice and tr is not None:
        tr.write_line(f"paritygate: {notice}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if RUN not in config.stash:
        return
    _close_gates(state(config))
    if hasattr(config, "workerinput"):
        return  # xdist worker: the controller writes the report
    if not config.getoption("--gate-config"):
        return  # not a gate session (the project's own tests)
    run = state(config)
    run.outcome = _finish(run, session, int(exitstatus))
    session.exitstatus = _pytest_exit(run.outcome, int(exitstatus))
    if run.outcome.written is not None:
        # The session ends next; pytest's exit-time gc passes need not walk the loaded models
        # and modules again (a second and more on a transformers process).
        gc.freeze()


def _close_gates(run: GateRun) -> None:
    """Stop the engines the session's gates started (vLLM's processes) while the session's
    streams are open: left to vLLM's exit-time finalizers, its shutdown warnings go to a
    stream pytest has closed and print "--- Logging error ---" tracebacks after the verdict."""
    for gate in run.gates.values():
        try:
            gate.close()
        except Exception as exc:  # a failed shutdown must not cost the verdict
            sys.stderr.write(f"paritygate: could not shut down {gate.config.name}'s engines: "
                             f"{type(exc).__name__}: {exc}\n")


def _pytest_exit(outcome: Outcome, exitstatus: int) -> int:
    """pytest's conventions: 5 nothing verified, 4 bad input, 2 interrupted."""
    if outcome.kind in ("input_error", "usage_error"):
        return int(EXIT_STOPPED)
    if outcome.kind == "nothing_verified":
        return int(EXIT_NOTHING_VERIFIED)
    if outcome.kind == "interrupted":
        return int(pytest.ExitCode.INTERRUPTED)
    if outcome.kind == "pass" and exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        return 0  # --allow-skips with nothing selected
    if outcome.kind == "fail":
        return int(pytest.ExitCode.TESTS_FAILED)
    return exitstatus


def _finish(run: GateRun, session: pytest.Session, exitstatus: int) -> Outcome:
    """Decide the outcome, then commit golden and write the reports (or neither)."""
    config = session.config
    gate = next(iter(run.gates.values()), None)
    if run.bad_input:
        return _stop(gate, Outcome("input_error", run.bad_input[0]))
    if exitstatus == pytest.ExitCode.INTERRUPTED or run.interrupted:
        return _stop(gate, Outcome("interrupted", INTERRUPTED_LINE))
    if exitstatus in (pytest.ExitCode.USAGE_ERROR, pytest.ExitCode.INTERNAL_ERROR):
        return _stop(gate, Outcome("usage_error"))
    if config.getoption("collectonly", False):
        return _stop(gate, Outcome("collect_only"))
    try:
        gate = _get_gate(config)
    except InputError as exc:
        return _stop(gate, Outcome("input_error", exc.line()))
    ran = {r.id for r in run.results}
    stopped = bool(session.shouldfail or session.shouldstop)
    not_run = [cid for cid in run.selected if cid not in ran] if stopped else []
    return conclude(gate, run.results, _report_dir(config, gate), not_run=not_run,
                    hint=marker_hint(config))


def _stop(gate: Gate | None, outcome: Outcome) -> Outcome:
    """End without a verdict: nothing this run blessed is written, no report either."""
    if gate is not None:
        gate.discard_golden()
    return outcome


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config
) -> None:
    if hasattr(config, "workerinput") or RUN not in config.stash:
        return  # xdist worker: its errors travel to the controller, which prints the one line
    run = state(config)
    outcome = run.outcome
    if outcome is None:
        return
    if outcome.kind in ("input_error", "interrupted") and outcome.line:
        if not run.owns_stderr:
            print(f"paritygate: {'error: ' if outcome.kind == 'input_error' else ''}"
                  f"{outcome.line}", file=sys.stderr)
        return
    if outcome.written is not None:
        terminalreporter.write_sep("=", "paritygate")
    for line in summary_lines(outcome):
        terminalreporter.write_line(line)
