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
from pathlib import Path
from typing import Any

import pytest

RESULT_KEY = "paritygate_result"
INPUT_ERROR_KEY = "paritygate_input_error"

_GATES: dict[str, Any] = {}
"""Gates already built in this process (the CLI pre-builds one to validate inputs)."""
_INPUT_ERRORS: dict[str, Any] = {}
EXIT_NOTHING_VERIFIED = 3
"""A run that verified nothing (every selected check skipped, or none selected) never passes."""
LAST_RUN: dict[str, Any] = {}
"""Outcome of the last session in this process: the CLI prints its one stderr line from it."""
CLI_OWNS_STDERR: dict[str, bool] = {"on": False}
"""Set by the CLI, which prints bad input and nothing-verified lines on stderr itself."""


def register_gate(gate: Any) -> None:
    """Let the plugin reuse a gate the caller already built (same process only)."""
    _GATES[str(gate.config.path)] = gate


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
        "gpu: needs a CUDA device (and vLLM where named)",
    ):
        config.addinivalue_line("markers", line)
    config._paritygate_results = []  # type: ignore[attr-defined]
    config._paritygate_input_errors = []  # type: ignore[attr-defined]
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
    from paritygate.errors import InputError
    from paritygate.workers import WorkerPlan, idle_cores, plan_workers, previous_durations

    try:
        gate = _get_gate(config)
    except InputError:
        plan = WorkerPlan(0)  # the first check reports the bad input, once
    else:
        report_dir = config.getoption("--report-dir")
        out = Path(report_dir) if report_dir else gate.config.default_report_dir()
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
        config._paritygate_notice = plan.notice  # type: ignore[attr-defined]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect gate files whose check does not apply to the configured family."""
    path = config.getoption("--gate-config")
    gate_items = [i for i in items if "gate_check" in getattr(i, "fixturenames", ())]
    if not path or not gate_items:
        return
    from paritygate.errors import InputError
    from paritygate.gate import Gate

    try:
        wanted = {c.id for c in Gate.from_path(path).checks()}
    except InputError:
        return  # reported when the first check builds the gate
    drop = [i for i in gate_items if i.name.removeprefix("test_") not in wanted]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = [i for i in items if i not in drop]
    from paritygate.checks import CHECK_IDS

    order = {f"test_{cid}": n for n, cid in enumerate(CHECK_IDS)}
    items.sort(key=lambda i: order.get(i.name, -1) if i in gate_items else -1)


def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config) -> Any:
    """Gate checks print their own progress line; keep pytest's status letters out of it
    (the word stays, so the short summary still reads ``FAILED <test>``)."""
    if report.when == "call" and any(k == RESULT_KEY for k, _ in report.user_properties):
        return report.outcome, "", report.outcome.upper()
    return None


def _get_gate(config: pytest.Config) -> Any:
    from paritygate.errors import InputError
    from paritygate.gate import Gate

    path = config.getoption("--gate-config")
    if not path:
        raise InputError(None, "--gate-config", "no gate config given (or set PARITYGATE_CONFIG)")
    key = str(Path(path).resolve())
    if key in _INPUT_ERRORS:
        raise _INPUT_ERRORS[key]
    if key not in _GATES:
        try:
            report_dir = config.getoption("--report-dir")
            gate = Gate.from_path(
                path,
                update_golden=config.getoption("--update-golden"),
                report_dir=report_dir,
            )
            gate.check_writable(Path(report_dir) if report_dir else None)
            gate.context  # noqa: B018 - build and validate every input once
        except InputError as exc:
            _INPUT_ERRORS[key] = exc
            raise
        _GATES[key] = gate
    gate = _GATES[key]
    gate.update_golden = config.getoption("--update-golden")
    gate.allow_skips = config.getoption("--allow-skips")
    return gate


@pytest.fixture(scope="session")
def paritygate_gate(pytestconfig: pytest.Config) -> Any:
    """The :class:`~paritygate.gate.Gate` for ``--gate-config``."""
    return _get_gate(pytestconfig)


@pytest.fixture
def gate_check(request: pytest.FixtureRequest) -> Any:
    """``gate_check(check_id)``: evaluate one check; fail or skip the test by its verdict."""
    from paritygate.errors import InputError

    def run(check_id: str) -> Any:
        try:
            gate = _get_gate(request.config)
            result = gate.evaluate(check_id)
        except InputError as exc:
            request.node.user_properties.append((INPUT_ERROR_KEY, exc.line()))
            pytest.fail(f"bad input: {exc.line()}", pytrace=False)
        from paritygate.files import json_default

        payload = json.dumps(result.to_json(), default=json_default)
        request.node.user_properties.append((RESULT_KEY, payload))
        if result.status == "skip":
            pytest.skip(result.message)
        if result.status != "pass":
            pytest.fail(f"{check_id} {result.status}: {result.message}", pytrace=False)
        return result

    return run


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failing check's cause is printed once, in the paritygate summary; pytest's failure
    section points there and its short summary keeps the plain ``FAILED <test>`` line."""
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        for name, value in report.user_properties:
            if name == RESULT_KEY:
                check_id = json.loads(value).get("id", item.name.removeprefix("test_"))
                report.longrepr = f"{check_id}: the cause is in the paritygate summary below"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    config = _CONFIG.get("config")
    if config is None or report.when != "call":
        return
    for name, value in report.user_properties:
        if name == RESULT_KEY:
            from paritygate.result import CheckResult

            result = CheckResult.from_json(json.loads(value))
            config._paritygate_results.append(result)
            _progress(config, result)
        elif name == INPUT_ERROR_KEY and value not in config._paritygate_input_errors:
            config._paritygate_input_errors.append(value)


_CONFIG: dict[str, pytest.Config] = {}


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    _CONFIG["config"] = session.config
    notice = getattr(session.config, "_paritygate_notice", None)
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    if notice and tr is not None:
        tr.write_line(f"paritygate: {notice}")


def _progress(config: pytest.Config, result: Any) -> None:
    tr = config.pluginmanager.get_plugin("terminalreporter")
    if tr is None:
        return
    key = result.key_metric
    value = result.metrics.get(key) if key else None
    shown = f"{key}={value:.3g}" if isinstance(value, float) else (f"{key}={value}" if key else "")
    tr.write_line(
        f"[paritygate] {result.status:>5}  {result.id:<22} {result.duration_s:6.2f}s  {shown}"
    )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if hasattr(config, "workerinput"):
        return  # xdist worker: the controller writes the report
    errors: list[str] = getattr(config, "_paritygate_input_errors", [])
    results = getattr(config, "_paritygate_results", [])
    LAST_RUN.clear()
    if errors:
        LAST_RUN["input_error"] = errors[0]
        session.exitstatus = 2
        return
    if not config.getoption("--gate-config"):
        return  # not a gate session (the project's own tests)
    from paritygate.errors import InputError
    from paritygate.report import NOTHING_VERIFIED, nothing_verified_reason, write_reports

    try:
        gate = _get_gate(config)
    except InputError as exc:
        LAST_RUN["input_error"] = exc.line()
        session.exitstatus = 2
        return
    report_dir = config.getoption("--report-dir")
    out = Path(report_dir) if report_dir else gate.config.default_report_dir()
    order = {c.id: i for i, c in enumerate(gate.checks())}
    results = sorted(results, key=lambda r: order.get(r.id, 99))
    try:
        written = write_reports(gate, results, out)
    except OSError as exc:
        LAST_RUN["input_error"] = f"{out}: report_dir: cannot write the report: {exc.strerror}"
        session.exitstatus = 2
        return
    config._paritygate_written = written  # type: ignore[attr-defined]
    # The session ends next; pytest's exit-time gc passes need not walk the loaded models
    # and modules again (a second and more on a transformers process).
    gc.freeze()
    LAST_RUN["status"] = written.status
    if written.status == NOTHING_VERIFIED:
        LAST_RUN["nothing_verified"] = nothing_verified_reason(results)
        session.exitstatus = EXIT_NOTHING_VERIFIED
    elif written.status == "pass" and session.exitstatus == 5:
        session.exitstatus = 0  # --allow-skips with nothing selected


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return  # xdist worker: its errors travel to the controller, which prints the one line
    errors: list[str] = getattr(config, "_paritygate_input_errors", [])
    error = LAST_RUN.get("input_error") or (errors[0] if errors else None)
    if error:
        if not CLI_OWNS_STDERR["on"]:
            import sys

            print(f"paritygate: error: {error}", file=sys.stderr)
        return
    written = getattr(config, "_paritygate_written", None)
    if written is None:
        return
    from paritygate.report import summary_table

    terminalreporter.write_sep("=", "paritygate")
    for line in summary_table(written.results):
        terminalreporter.write_line(line)
    terminalreporter.write_line(f"status: {written.status}   reports: {written.directory}")
    if "nothing_verified" in LAST_RUN:
        terminalreporter.write_line(f"paritygate: {LAST_RUN['nothing_verified']}")
