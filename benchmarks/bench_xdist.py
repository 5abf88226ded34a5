"""Serial vs ``-n N`` for ``paritygate run`` as whole processes, and where the time goes.

Usage::

    python benchmarks/bench_xdist.py CONFIG [--workers 2] [--repeats 3] [--force]

Runs ``paritygate run CONFIG`` serially and with ``-n N`` alternately (``--repeats``
times each, the order reversed on every other repeat), and prints each wall time, the
medians and their ratio. Each run writes into a fresh report folder, so ``-n N`` has no
earlier report and paritygate runs the checks serially (saying so); ``--force`` adds a
third side, ``-n N --force-workers``, which starts the workers regardless. Beside that,
the minimal work: one process importing the stack and building the gate's context
(what every xdist worker repeats before its first check), and the checks alone.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROBE = """
import time, sys
t0 = time.perf_counter()
from paritygate.gate import Gate
gate = Gate.from_path(sys.argv[1])
t1 = time.perf_counter()
gate.context
t2 = time.perf_counter()
for c in gate.checks():
    gate.evaluate(c.id, golden=False)
t3 = time.perf_counter()
print(f"{t1 - t0:.2f} {t2 - t1:.2f} {t3 - t2:.2f}")
"""


def _wall(cmd: list[str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--workers", default="2")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--force", action="store_true",
                        help="also time -n N --force-workers (workers started regardless)")
    args = parser.parse_args()
    base = [sys.executable, "-m", "paritygate", "run", str(args.config)]
    serial: list[float] = []
    parallel: list[float] = []
    forced: list[float] = []
    workers = ["-n", args.workers]
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            sides = [(serial, [*base, "--report-dir", f"{tmp}/s{i}"]),
                     (parallel, [*base, "--report-dir", f"{tmp}/p{i}", *workers])]
            if args.force:
                sides.append((forced, [*base, "--report-dir", f"{tmp}/f{i}", *workers,
                                       "--force-workers"]))
            # Reverse the order on odd repeats, so a machine load that rises or falls over
            # the benchmark hits every side alike.
            for times, cmd in sides[::-1] if i % 2 else sides:
                times.append(_wall(cmd))
            line = f"run {i}: serial {serial[-1]:.1f}s, -n {args.workers} {parallel[-1]:.1f}s"
            if args.force:
                line += f", -n {args.workers} --force-workers {forced[-1]:.1f}s"
            print(line, flush=True)
    probe = subprocess.run([sys.executable, "-c", PROBE, str(args.config)],
                           capture_output=True, text=True, check=True).stdout.split()
    load, context, checks = (float(x) for x in probe)
    s, p = statistics.median(serial), statistics.median(parallel)
    print(f"median: serial {s:.1f}s, -n {args.workers} {p:.1f}s, ratio {p / s:.2f}x")
    if forced:
        f = statistics.median(forced)
        print(f"median: -n {args.workers} --force-workers {f:.1f}s, ratio {f / s:.2f}x")
    print(f"one process: config load {load:.1f}s, imports + context build {context:.1f}s, "
          f"all checks {checks:.1f}s (each xdist worker repeats the first two)")


if __name__ == "__main__":
    main()
