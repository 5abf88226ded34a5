"""Wall time, CPU time and peak memory of each hostile-input refusal, whole process.

Runs every case of ``test_suites/lm/test_fuzz_bounds.py`` (JSON nested 200,000 deep, YAML
alias bombs, 10^5 completions, a 10^12 ``behaviour.samples``, 202 checkpoints for ``--all``,
NaN and 10^12 sizes in a model's ``config.json``, ...) one at a time as ``paritygate run`` on
the demo's models, and prints per case: exit code, wall seconds, CPU seconds (user + system)
and the peak RSS of the gate process, with the machine's load. The issue's goal for each is
exit 2 within 10 s on a 2-core machine and under 2 GB; the test suite asserts the exit, the
one line and the memory bound, never the time.

    python benchmarks/bench_fuzz_refusals.py DEMO_DIR   # DEMO_DIR: what `paritygate demo` wrote
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "test_suites" / "lm"),
                str(Path(__file__).resolve().parents[1] / "test_suites")]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("demo", type=Path, help="the folder `paritygate demo` wrote")
    args = parser.parse_args()
    from test_fuzz_bounds import build_cases, run_measured

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cases = build_cases(args.demo / "lm" / "model", args.demo / "policy", Path(tmp))
        for case in cases:
            res = run_measured(case)
            rows.append((case.id, res["code"], res["wall"], res["cpu"], res["kb"] / 1024))
    load = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    print(f"load: {load}")
    print(f"{'case':36} exit  wall s   CPU s  peak MiB")
    for cid, code, wall, cpu, mib in rows:
        print(f"{cid:36} {code:4} {wall:7.1f} {cpu:7.1f} {mib:9.0f}")
    print(f"slowest wall {max(r[2] for r in rows):.1f} s, largest peak "
          f"{max(r[4] for r in rows):.0f} MiB, every exit 2: {all(r[1] == 2 for r in rows)}")


if __name__ == "__main__":
    main()
