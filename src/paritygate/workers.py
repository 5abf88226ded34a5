"""Whether pytest-xdist workers can shorten a gate run, and the one line saying why not.

Every xdist worker is a fresh process: it imports torch, ONNX Runtime or transformers
and builds the gate's context again (checkpoint, models, artifact session, probes), and
the forward passes and generations that checks share in one process are computed again
in each worker that needs them. Workers pay off only when the checks they take over
outlast that start-up and there are idle cores to run them. The controller has measured
its own start-up (the same work a worker repeats), the previous report in the same
report folder gives each check's duration, and the load average tells how many cores
are idle. Without such a report there is no evidence that workers help, so the gate
runs serially; the verdict and metrics are the same either way.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class WorkerPlan:
    """How many xdist workers to start (0: run in this process) and why, when overridden."""

    workers: int
    notice: str | None = None


def previous_durations(report_json: Path, name: str) -> list[float] | None:
    """Per-check durations from an earlier ``report.json`` of the gate ``name``, if any."""
    try:
        report = json.loads(report_json.read_text(encoding="utf-8"))
        if report.get("name") != name:
            return None
        durations = [float(c["duration_s"]) for c in report["checks"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return durations or None


def idle_cores() -> float:
    """Usable cores minus the 1-minute load average (which includes this process)."""
    import os

    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = 0.0
    return cores - load


def plan_workers(
    requested: int,
    startup_s: float,
    durations: Sequence[float] | None,
    report_dir: Path,
    idle: float,
) -> WorkerPlan:
    """Keep ``requested`` workers only if the estimated parallel wall time is shorter.

    Estimate: serial = sum of the check durations; parallel = one worker start-up
    (``startup_s``, the workers start side by side) + the larger of the longest check
    and the total shared among the workers that can run at once: this process's core
    plus each whole ``idle`` core, at most ``requested``. On a busy machine (no idle
    core) more processes only add work.
    """
    if requested <= 1:
        return WorkerPlan(requested)
    head = (f"-n {requested}: running the checks serially in this process: each worker "
            f"would repeat the {startup_s:.1f}s start-up (imports, loading every input)")
    if not durations:
        return WorkerPlan(0, f"{head}, and no earlier report in {report_dir} shows checks "
                             "long enough to gain from it")
    serial = sum(durations)
    at_once = max(1, min(requested, 1 + int(max(0.0, idle))))
    parallel = startup_s + max(max(durations), serial / at_once)
    if parallel < serial:
        return WorkerPlan(requested)
    return WorkerPlan(0, f"{head}, while the last run's checks took {serial:.1f}s in all "
                         f"(estimated {parallel:.1f}s with {requested} workers, "
                         f"{max(0.0, idle):.1f} idle cores)")
