"""The ``-n N`` decision: workers only when the checks they take over outlast their start-up."""

from __future__ import annotations

import json
from pathlib import Path

from paritygate.workers import plan_workers, previous_durations


def test_one_worker_or_none_is_left_alone() -> None:
    assert plan_workers(1, 10.0, None, Path("r"), 4.0).workers == 1
    assert plan_workers(0, 10.0, [5.0], Path("r"), 4.0).workers == 0


def test_no_earlier_report_runs_serially_and_says_why() -> None:
    plan = plan_workers(2, 9.5, None, Path("reports/x"), 4.0)
    assert plan.workers == 0
    assert plan.notice is not None and "9.5s start-up" in plan.notice
    assert "no earlier report in reports/x" in plan.notice


def test_short_checks_run_serially() -> None:
    # 8 s of checks, 10 s start-up per worker: 10 + max(5, 4) = 15 s > 8 s
    plan = plan_workers(2, 10.0, [5.0, 1.0, 1.0, 1.0], Path("r"), 4.0)
    assert plan.workers == 0
    assert plan.notice is not None and "took 8.0s in all" in plan.notice
    assert "15.0s with 2 workers" in plan.notice


def test_long_balanced_checks_keep_the_workers() -> None:
    # 100 s of checks: 10 + max(30, 50) = 60 s < 100 s
    assert plan_workers(2, 10.0, [30.0, 30.0, 20.0, 20.0], Path("r"), 4.0).workers == 2


def test_one_dominant_check_cannot_be_split() -> None:
    # the longest check bounds the parallel run: 10 + 90 = 100 s = serial
    assert plan_workers(4, 10.0, [90.0, 5.0, 5.0], Path("r"), 4.0).workers == 0


def test_a_busy_machine_runs_serially() -> None:
    # the same long balanced checks, but no idle core: 10 + 100 s > 100 s
    plan = plan_workers(2, 10.0, [30.0, 30.0, 20.0, 20.0], Path("r"), -3.5)
    assert plan.workers == 0
    assert plan.notice is not None and "0.0 idle cores" in plan.notice
    assert plan_workers(2, 10.0, [30.0, 30.0, 20.0, 20.0], Path("r"), 0.9).workers == 0
    assert plan_workers(2, 10.0, [30.0, 30.0, 20.0, 20.0], Path("r"), 1.0).workers == 2


def test_previous_durations_reads_only_this_gates_report(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    assert previous_durations(report, "g") is None
    report.write_text(json.dumps({"name": "g", "checks": [
        {"id": "a", "duration_s": 1.5}, {"id": "b", "duration_s": 2.0}]}), encoding="utf-8")
    assert previous_durations(report, "g") == [1.5, 2.0]
    assert previous_durations(report, "other") is None
    report.write_text("{not json", encoding="utf-8")
    assert previous_durations(report, "g") is None
    report.write_text(json.dumps({"name": "g", "checks": []}), encoding="utf-8")
    assert previous_durations(report, "g") is None
