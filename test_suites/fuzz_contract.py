"""Shared harness of the bad-input fuzz suites: run each case through the CLI and check
the contract.

Cases run in this process through ``paritygate.cli.main`` with file-descriptor capture
(``capfd``: what C libraries write to fd 2 counts too), one at a time in the case's folder,
the modules imported from case folders dropped afterwards; only the cases with extra
arguments that start workers (``-n 2``) run as ``python -m paritygate`` subprocesses. The
process-level contract (the installed entry point, an interpreter exit code) is held once per
suite by those and by the ``*_through_the_cli`` tests; starting the interpreter, torch and
the libraries again for each case would cost seconds apiece and test nothing more.

A case is a folder holding its gate config and every faulty input it points at. The
contract, checked per case: exit code 2; stderr is exactly one ``paritygate: error:`` line
naming the file and the key; no traceback on stdout or stderr; no canary file created (a
pickled payload that ran would create one); every input file's sha256 unchanged.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CANARY = "canary.txt"


class Canary:
    """Unpickling this object calls ``open(path, "w")``: it creates the canary file."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[str, str]]:
        return open, (self.path, "w")


@dataclass
class Case:
    """One bad input: the config to run, the file and key its error line must name."""

    id: str
    config: Path
    file: str
    key: str | None
    args: tuple[str, ...] = ()
    inputs: list[Path] = field(default_factory=list)
    """Extra files (outside the case folder) whose bytes must stay unchanged."""


def tree_digest(paths: Iterable[Path]) -> dict[str, str]:
    """sha256 of every regular file under ``paths`` (files or folders)."""
    out: dict[str, str] = {}
    for root in paths:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for p in files:
            out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def run_cli(case: Case) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("GITHUB_STEP_SUMMARY", "PARITYGATE_CONFIG")}
    proc = subprocess.run(
        [sys.executable, "-m", "paritygate", "run", str(case.config), *case.args],
        cwd=case.config.parent, capture_output=True, text=True, timeout=600, env=env,
    )
    return proc.returncode, proc.stdout, proc.stderr


def run_here(case: Case, capfd: Any) -> tuple[int, str, str]:
    """``paritygate run`` on ``case`` in this process, stdout and stderr captured at the fd."""
    import traceback

    from paritygate import cli

    modules, path, cwd = set(sys.modules), list(sys.path), os.getcwd()
    saved = {k: os.environ.pop(k) for k in ("GITHUB_STEP_SUMMARY", "PARITYGATE_CONFIG")
             if k in os.environ}
    capfd.readouterr()
    tail = ""
    try:
        os.chdir(case.config.parent)
        code = cli.main(["run", str(case.config), *case.args])
    except SystemExit as exc:  # argparse refusing the arguments
        code = exc.code if isinstance(exc.code, int) else 1
    except Exception:  # what would have been an interpreter's traceback
        code, tail = 1, traceback.format_exc()
    finally:
        os.chdir(cwd)
        sys.path[:] = path
        os.environ.update(saved)
        root = case.config.parent.parent
        for name in set(sys.modules) - modules:  # user code imported from case folders
            file = getattr(sys.modules[name], "__file__", None) or ""
            if file.startswith(str(root)):
                del sys.modules[name]
    out, err = capfd.readouterr()
    return code, out, err + tail


def contract_breach(case: Case, code: int, out: str, err: str) -> str | None:
    """None when the run kept the bad-input contract, else what broke it."""
    lines = [line for line in err.splitlines() if line.strip()]
    if "Traceback" in out + err:
        return f"traceback (exit {code}): {(out + err)[-600:]}"
    if code != 2:
        return f"exit {code}: stderr {err[-300:]!r} stdout {out[-300:]!r}"
    if len(lines) != 1 or not lines[0].startswith("paritygate: error: "):
        return f"stderr is not one error line: {err[-600:]!r}"
    if case.file not in lines[0]:
        return f"{case.file} not named: {lines[0]}"
    if case.key is not None and f": {case.key}" not in lines[0]:
        return f"key {case.key} not named: {lines[0]}"
    return None


def run_cases(cases: list[Case], shared_inputs: list[Path], capfd: Any) -> dict[str, str]:
    """Run every case (see the module's docstring for where); returns ``{case id: breach}``
    for the broken ones."""
    watched = [*shared_inputs, *(c.config.parent for c in cases)]
    watched += [p for c in cases for p in c.inputs]
    before = tree_digest(watched)
    spawned = [c for c in cases if "-n" in c.args]
    with ThreadPoolExecutor(2) as pool:
        results = dict(zip((c.id for c in spawned), pool.map(run_cli, spawned), strict=True))
    for case in cases:
        if case.id not in results:
            results[case.id] = run_here(case, capfd)
    outcomes = [results[c.id] for c in cases]
    broken: dict[str, str] = {}
    for case, (code, out, err) in zip(cases, outcomes, strict=True):
        problem = contract_breach(case, code, out, err)
        if (case.config.parent / CANARY).exists():
            problem = "the canary exists: loading ran code from an input"
        if problem:
            broken[case.id] = problem
    after = tree_digest(watched)
    changed = sorted(p for p, digest in before.items() if after.get(p) != digest)
    if changed:
        broken["<inputs>"] = f"input files changed or removed: {changed[:5]}"
    return broken
