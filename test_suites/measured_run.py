"""Bounds a loaded machine cannot break: what a run did, measured by the run itself.

A wall-clock limit measures the machine's load as much as the code (a 10 s limit failed on a
2-core machine at load 20). The contracts the hostile-input tests state are about work, so
they are measured as work: the CPU seconds the process spent, the bytes it read
(``/proc/self/io`` ``rchar``), and which heavy modules it had imported when it refused (a
refusal before the model loads never imports transformers). Wall time is only a hang guard,
far above any run on any machine.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

HANG_GUARD_S = 600
"""A child still running after this long is hung (a FIFO read blocks forever): killed, failed."""

HEAVY_MODULES = ("torch", "transformers", "onnxruntime", "vllm")

_PROBE = r"""
import json, os, resource, sys
sys.argv[0] = "paritygate"
HEAVY = os.environ["PG_MEASURED_HEAVY"].split(",")
try:
    from paritygate.cli import main
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code if isinstance(exc.code, int) else 1
finally:
    try:
        with open("/proc/self/io", encoding="ascii") as fh:
            io = dict(line.split(": ") for line in fh.read().splitlines())
    except OSError:
        io = {}
    usage = resource.getrusage(resource.RUSAGE_SELF)
    with open(os.environ["PG_MEASURED_OUT"], "w", encoding="utf-8") as fh:
        json.dump({"modules": sorted(m for m in HEAVY if m in sys.modules),
                   "read_bytes": int(io.get("rchar", -1)),
                   "cpu_s": usage.ru_utime + usage.ru_stime}, fh)
sys.exit(code)
"""


@dataclass(frozen=True)
class MeasuredRun:
    """A ``paritygate`` child's exit code and streams, and what it did."""

    code: int
    out: str
    err: str
    modules: tuple[str, ...]
    """The heavy modules imported when it exited."""
    read_bytes: int
    """Bytes read through read(2) and friends (``rchar``; -1 where /proc is absent)."""
    cpu_s: float
    """User + system CPU seconds of the process (load moves wall time, not this)."""


def run_measured(args: list[str], cwd: Path) -> MeasuredRun:
    """``paritygate ARGS`` in a child process (the environment's GitHub summary and config
    variables dropped), measured by the child itself."""
    out_file = cwd / f".measured-{os.getpid()}.json"
    env = {k: v for k, v in os.environ.items()
           if k not in ("GITHUB_STEP_SUMMARY", "PARITYGATE_CONFIG")}
    env["PG_MEASURED_OUT"] = str(out_file)
    env["PG_MEASURED_HEAVY"] = ",".join(HEAVY_MODULES)
    proc = subprocess.run([sys.executable, "-c", _PROBE, *args], cwd=cwd, capture_output=True,
                          text=True, timeout=HANG_GUARD_S, env=env)
    data = json.loads(out_file.read_text(encoding="utf-8"))
    out_file.unlink()
    return MeasuredRun(proc.returncode, proc.stdout, proc.stderr, tuple(data["modules"]),
                       int(data["read_bytes"]), float(data["cpu_s"]))


def read_bytes_now() -> int:
    """This process's ``rchar`` so far (-1 where /proc is absent)."""
    try:
        with open("/proc/self/io", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("rchar:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


def cpu_seconds_now() -> float:
    """This process's user + system CPU seconds so far (every thread)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
