"""``run --all``'s gate processes: forked after the family's imports (Linux, a process that
started fresh), each gate's exit code returned, its exceptions printed as an interpreter would,
its exit handlers run in it and the parent's kept; an interrupt of the parent reaches the gate
that runs, which stops first. Outside a fresh process each gate is a new interpreter."""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from paritygate.cli_series import _forked_gate, gate_processes
from paritygate.cli_signals import Signals, Terminated

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork: Linux")


def test_the_gates_exit_code_and_its_own_process(tmp_path: Path) -> None:
    marker = tmp_path / "pid"

    def entry(cmd: list[str]) -> int:
        marker.write_text(f"{os.getpid()} {' '.join(cmd)}", encoding="utf-8")
        return 3

    assert _forked_gate(entry, ["run", "x.yaml"]) == 3
    pid, cmd = marker.read_text(encoding="utf-8").split(" ", 1)
    assert int(pid) != os.getpid() and cmd == "run x.yaml"


def test_an_uncaught_exception_is_printed_and_exit_1(capfd: pytest.CaptureFixture[str]) -> None:
    def entry(cmd: list[str]) -> int:
        raise ValueError("broken gate")

    assert _forked_gate(entry, []) == 1
    err = capfd.readouterr().err
    assert "Traceback" in err and "ValueError: broken gate" in err


def test_exit_handlers_are_the_gates_own(tmp_path: Path) -> None:
    parents = tmp_path / "parent-handler-ran"
    gates = tmp_path / "gate-handler-ran"

    def parent_handler() -> None:
        parents.touch()

    atexit.register(parent_handler)
    try:
        def entry(cmd: list[str]) -> int:
            atexit.register(gates.touch)
            return 0

        assert _forked_gate(entry, []) == 0
    finally:
        atexit.unregister(parent_handler)
    assert gates.exists() and not parents.exists()


def test_sigterm_of_the_parent_stops_the_running_gate_first(tmp_path: Path) -> None:
    started, stopped = tmp_path / "started", tmp_path / "stopped"

    def entry(cmd: list[str]) -> int:
        started.touch()
        try:
            time.sleep(60)
        except Terminated:
            stopped.touch()
            return 143
        return 0

    def terminate_when_started() -> None:
        deadline = time.monotonic() + 60
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    signals = Signals()
    threading.Thread(target=terminate_when_started, daemon=True).start()
    try:
        with pytest.raises(Terminated):
            _forked_gate(entry, [])
    finally:
        signals.restore()
    assert stopped.exists()  # the gate stopped as an interrupted run, before the parent went on


def test_a_process_that_did_not_start_fresh_runs_each_gate_as_a_new_interpreter() -> None:
    run = gate_processes("policy", fresh=False, entry=lambda cmd: 0)
    assert run(["--version"]) == 0  # python -m paritygate --version, in a subprocess
    assert getattr(run, "func", None) is not _forked_gate
