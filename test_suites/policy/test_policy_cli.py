"""End to end through the real CLI: bless golden, pass, fail on a fault, same verdict under -n 2."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from policy_zoo import FAULTS_BY_ID, POLICY_CHECKS, base_config, merge

pytestmark = pytest.mark.xdist_group("policy-cli")

REPORT_FILES = ("report.json", "report.md", "report.html", "junit.xml")


def paritygate_run(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("GITHUB_STEP_SUMMARY", "PARITYGATE_CONFIG")}
    return subprocess.run([sys.executable, "-m", "paritygate", "run", str(config), *args],
                          cwd=config.parent, capture_output=True, text=True, timeout=300, env=env)


def write_config(path: Path, data: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def checks_by_id(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    ids = [c["id"] for c in report["checks"]]
    assert len(ids) == len(set(ids)), f"check listed twice in report.json: {ids}"
    return {c["id"]: c for c in report["checks"]}


@pytest.fixture(scope="module")
def gate_dir(clean_demo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clean gate config with golden blessed by ``paritygate run --update-golden``."""
    root = tmp_path_factory.mktemp("policy-cli")
    data = base_config(clean_demo)
    data["name"] = "e2e-policy"
    data["golden"] = {"dir": "golden"}
    config = write_config(root / "clean.yaml", data)
    proc = paritygate_run(config, "--update-golden", "--report-dir", str(root / "bless"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    blessed = sorted(p.stem for p in (root / "golden" / "e2e-policy").glob("*.json"))
    assert set(POLICY_CHECKS) <= set(blessed), blessed
    return root


@pytest.fixture(scope="module")
def serial_report(gate_dir: Path) -> dict[str, Any]:
    proc = paritygate_run(gate_dir / "clean.yaml", "--report-dir", str(gate_dir / "serial"),
                          "--report-format", "json,md,junit,html")  # every report
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    return json.loads((gate_dir / "serial" / "report.json").read_text(encoding="utf-8"))


def test_clean_run_passes_with_every_report(gate_dir: Path, clean_demo: Path,
                                            serial_report: dict[str, Any]) -> None:
    for name in REPORT_FILES:
        assert (gate_dir / "serial" / name).is_file(), name
    report = serial_report
    assert {"name", "status", "checkpoint", "environment", "checks"} <= set(report)
    assert report["name"] == "e2e-policy"
    assert report["status"] == "pass"
    ckpt = clean_demo / "policy.safetensors"
    assert Path(report["checkpoint"]["path"]) == ckpt
    assert report["checkpoint"]["sha256"] == hashlib.sha256(ckpt.read_bytes()).hexdigest()
    assert isinstance(report["environment"], dict) and "torch" in report["environment"]
    checks = checks_by_id(report)
    for check in checks.values():
        assert {"id", "status", "metrics", "golden", "message"} <= set(check), check["id"]
        assert check["status"] in ("pass", "fail", "skip", "error")
        assert isinstance(check["metrics"], dict)
    for cid in POLICY_CHECKS:
        assert checks[cid]["status"] == "pass", (cid, checks[cid]["message"])
    # judged against the blessed baselines (checks whose metrics all vary legitimately
    # across checkpoints, like weights_load's counts, bless an empty record)
    assert checks["logits_agreement"]["golden"]["max_abs_diff"] == (
        checks["logits_agreement"]["metrics"]["max_abs_diff"])


def assert_same_verdict(serial_report: dict[str, Any], report_json: Path) -> None:
    parallel = json.loads(report_json.read_text(encoding="utf-8"))
    assert parallel["status"] == serial_report["status"]
    serial, xdist = checks_by_id(serial_report), checks_by_id(parallel)
    assert sorted(xdist) == sorted(serial)
    for cid, check in serial.items():
        assert xdist[cid]["status"] == check["status"], cid
        assert xdist[cid]["metrics"] == check["metrics"], cid


def test_xdist_gives_the_same_verdict_and_metrics(gate_dir: Path,
                                                  serial_report: dict[str, Any]) -> None:
    proc = paritygate_run(gate_dir / "clean.yaml", "-n", "2", "--force-workers",
                          "--report-dir", str(gate_dir / "xdist"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "serially" not in proc.stdout
    assert_same_verdict(serial_report, gate_dir / "xdist" / "report.json")


def test_workers_that_cannot_help_fall_back_to_serial(gate_dir: Path,
                                                      serial_report: dict[str, Any]) -> None:
    """No earlier report in the folder: -n 2 runs serially, says so in one line, same verdict."""
    proc = paritygate_run(gate_dir / "clean.yaml", "-n", "2", "--report-dir",
                          str(gate_dir / "fallback"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    notes = [line for line in proc.stdout.splitlines() if "serially" in line]
    assert len(notes) == 1 and notes[0].startswith("paritygate: -n 2: "), proc.stdout
    assert "no earlier report in" in notes[0]
    assert proc.stderr == ""
    assert_same_verdict(serial_report, gate_dir / "fallback" / "report.json")


def test_faulty_config_exits_1(gate_dir: Path, clean_demo: Path) -> None:
    """The blessed gate on an artifact with a baked temperature fails (exit 1), by name."""
    fault = FAULTS_BY_ID["temperature_baked"]
    overrides = fault.build(clean_demo, gate_dir / "faulty")
    data = yaml.safe_load((gate_dir / "clean.yaml").read_text(encoding="utf-8"))
    data["golden"] = {"dir": str(gate_dir / "golden")}
    config = write_config(gate_dir / "faulty" / "faulty.yaml", merge(data, overrides))
    proc = paritygate_run(config, "--report-dir", str(gate_dir / "faulty-report"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    report = json.loads((gate_dir / "faulty-report" / "report.json").read_text(encoding="utf-8"))
    assert report["status"] == "fail"
    check = checks_by_id(report)[fault.check]
    assert check["status"] == "fail"
    assert all(cause in check["message"] for cause in fault.causes), check["message"]


def _without_timings(path: Path) -> str:
    """A report file with its timings (check durations, when written, junit times) taken out."""
    import re

    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        def drop(node: Any) -> Any:
            if isinstance(node, dict):
                return {k: drop(v) for k, v in node.items()
                        if k not in ("duration_s", "generated_at")}
            return [drop(v) for v in node] if isinstance(node, list) else node
        return json.dumps(drop(json.loads(text)), sort_keys=True)
    return re.sub(r'time="[0-9.]+"', 'time=""', text)


def test_run_without_pytest_writes_the_reports_a_pytest_session_writes(
        gate_dir: Path, clean_demo: Path) -> None:
    """``paritygate run`` without ``-m`` or workers runs its checks without pytest; with
    ``-m`` the gate files run as a pytest session. On the faulty subject both exit 1 and
    write the same report.json, report.md and junit.xml (timings aside)."""
    fault = FAULTS_BY_ID["temperature_baked"]
    overrides = fault.build(clean_demo, gate_dir / "twice")
    data = yaml.safe_load((gate_dir / "clean.yaml").read_text(encoding="utf-8"))
    data["golden"] = {"dir": str(gate_dir / "golden")}
    config = write_config(gate_dir / "twice" / "faulty.yaml", merge(data, overrides))
    env = {k: v for k, v in os.environ.items()
           if k not in ("GITHUB_STEP_SUMMARY", "PARITYGATE_CONFIG")}
    plain = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "paritygate", "run", str(config),
         "--report-dir", str(gate_dir / "twice" / "plain")],
        cwd=config.parent, capture_output=True, text=True, timeout=300, env=env)
    session = paritygate_run(config, "-m", "fast or slow", "--report-dir",
                             str(gate_dir / "twice" / "pytest"))
    assert plain.returncode == session.returncode == 1, plain.stdout + session.stdout
    assert "| _pytest" not in plain.stderr and "| pytest" not in plain.stderr
    assert plain.stdout.splitlines()[-1].startswith(session.stdout.splitlines()[-1][:20])
    for name in ("report.json", "report.md", "junit.xml"):
        assert _without_timings(gate_dir / "twice" / "plain" / name) == _without_timings(
            gate_dir / "twice" / "pytest" / name), name
