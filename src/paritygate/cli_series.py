"""``paritygate run --all``: gate every saved checkpoint of a training run, each in its own
process, the first blessed with ``--bless-first``; the worst exit code is the run's."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable
from functools import partial

from paritygate.cli_signals import Terminated
from paritygate.errors import InputError
from paritygate.exit_codes import (
    EXIT_FAIL,
    EXIT_INPUT,
    EXIT_INTERRUPTED,
    EXIT_NOTHING_VERIFIED,
    EXIT_PASS,
    EXIT_TERMINATED,
    WORDS,
)

__all__ = ["PRELOAD", "gate_processes", "run_all"]


def run_all(
    args: argparse.Namespace,
    *,
    refuse_existing_baseline: Callable[[argparse.Namespace], None],
    entry: Callable[[list[str]], int],
) -> int:
    """``run --all``: one ``paritygate run --checkpoint PATH`` process per checkpoint-N, in step
    order; the worst exit code. ``entry`` is the command's own ``main`` (what a forked gate
    runs, see :func:`gate_processes`); ``refuse_existing_baseline`` is ``--bless-first``'s
    refusal, said before any gate runs."""
    from paritygate.load import load_config

    if args.checkpoint is not None or args.update_golden or args.step is not None:
        raise InputError(None, "--all", "--all gates every checkpoint: it takes neither "
                         "--checkpoint, --step nor --update-golden (bless one checkpoint, "
                         "or the first with --bless-first)")
    config = load_config(args.config)
    record = config.trainer_checkpoint
    from paritygate.trainer_output import MAX_ALL_CHECKPOINTS, checkpoint_series, saved_zips

    # read before any gate runs: gaps, unreadable trainer_state.json, no saves are exit 2
    if record is not None and record.output_dir is not None:
        series = checkpoint_series(record.output_dir)
    elif config.policy is not None:
        series = saved_zips(config.policy.checkpoint, config.path)
    else:
        raise InputError(config.path, "--all", "the config's model directory is not a trainer "
                         "output_dir (no checkpoint-N folders)")
    if len(series) > MAX_ALL_CHECKPOINTS:
        where = record.output_dir if record is not None and record.output_dir else config.path
        raise InputError(where, "--all", f"{len(series)} saved checkpoints, more than "
                         f"{MAX_ALL_CHECKPOINTS} (MAX_ALL_CHECKPOINTS; one gate process each): "
                         "gate chosen ones with --checkpoint PATH")
    base = args.report_dir or config.default_report_dir()
    worst = EXIT_PASS
    rank = {EXIT_PASS: 0, EXIT_NOTHING_VERIFIED: 1, EXIT_FAIL: 2, EXIT_INPUT: 3}
    if args.bless_first:
        refuse_existing_baseline(args)
    run_gate = gate_processes(config.family, getattr(args, "fresh_process", False), entry)
    for index, (step, folder) in enumerate(series):
        cmd = ["run", str(args.config), "--checkpoint", str(folder),
               "--report-dir", str(base / folder.stem)]
        if args.bless_first and index == 0:
            cmd += ["--bless-first", "--step", str(step)]
        if args.markexpr:
            cmd += ["-m", args.markexpr]
        if args.report_formats is not None:
            cmd += ["--report-format", args.report_formats]
        for cid in args.check_ids or []:
            cmd += ["--check", cid]
        if args.allow_skips:
            cmd.append("--allow-skips")
        print(f"paritygate: {folder.name} (step {step}): gating", flush=True)
        code = run_gate(cmd)
        if code in (EXIT_INTERRUPTED, EXIT_TERMINATED):
            raise KeyboardInterrupt
        word = WORDS.get(code, f"exit {code}")
        print(f"paritygate: {folder.name} (step {step}): {word}; reports in "
              f"{base / folder.stem}", flush=True)
        if rank.get(code, 3) > rank.get(worst, 3):
            worst = code
    return worst


PRELOAD = {
    "policy": ("torch", "pytest", "paritygate.gate", "paritygate.plugin"),
    "causal_lm": ("torch", "transformers", "pytest", "paritygate.gate", "paritygate.plugin"),
}
"""What every gate of a family imports, done once for a ``run --all`` series."""


def gate_processes(
    family: str, fresh: bool, entry: Callable[[list[str]], int]
) -> Callable[[list[str]], int]:
    """A runner of one ``paritygate`` command per checkpoint, each in its own process (a gate's
    state, its engines and a crash stay its own) and returning its exit code. Where the OS forks
    (Linux), the modules every gate of the family needs are imported once and each gate is
    forked from this process: a series of N checkpoints pays the imports once, not N times.
    Only a process that started fresh for this command forks (``fresh``: no torch loaded and
    no other thread when the command began, so no torch operation has run and no thread is
    lost in the child); elsewhere, and in any other caller, each gate is a fresh interpreter."""
    if not (fresh and sys.platform.startswith("linux")):
        import subprocess

        return lambda cmd: subprocess.run([sys.executable, "-m", "paritygate", *cmd],
                                          check=False).returncode
    import importlib

    for name in PRELOAD.get(family, PRELOAD["policy"]):
        importlib.import_module(name)
    return partial(_forked_gate, entry)


def _forked_gate(entry: Callable[[list[str]], int], cmd: list[str]) -> int:
    """Run ``entry(cmd)`` (``paritygate CMD``) in a forked child; its exit code. An interrupt
    of this process (Ctrl-C reaches both; SIGTERM only this one) is passed to the child, whose
    gate then stops as an interrupted run does (no report, golden untouched), then this one."""
    import signal

    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: one gate, then exit as its own process would
        os._exit(_child(entry, cmd))
    try:
        _, status = os.waitpid(pid, 0)
    except KeyboardInterrupt as exc:
        if isinstance(exc, Terminated) or not _exits_within(pid, INTERRUPT_REACHES_S):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT)
            os.waitpid(pid, 0)
        raise
    return os.waitstatus_to_exitcode(status)


INTERRUPT_REACHES_S = 2.0
"""A terminal's Ctrl-C reaches the forked gate too (one process group): it is sent on only to a
gate still running this long after (a SIGINT sent to this process alone)."""


def _exits_within(pid: int, seconds: float) -> bool:
    """Whether the child ``pid`` exits (and is reaped) within ``seconds``."""
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return True
        time.sleep(0.05)
    return False


def _child(entry: Callable[[list[str]], int], cmd: list[str]) -> int:
    """The forked gate: ``entry(cmd)``, then the exit handlers the gate registered (not the
    parent's: a temporary folder the parent still uses stays), as its own interpreter's exit
    would run them, and processes it started (vLLM's engine) stopped. Never returns into the
    caller's frames: the caller exits with the code."""
    import atexit
    import multiprocessing.util

    atexit._clear()
    atexit.register(multiprocessing.util._exit_function)  # type: ignore[attr-defined]
    code = 1
    try:
        code = entry(cmd)
    except BaseException:  # what an interpreter prints for an exception nobody caught
        import traceback

        traceback.print_exc()
    finally:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    return code
