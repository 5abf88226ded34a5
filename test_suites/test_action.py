"""The composite action (`action.yml`) and the reusable workflow (`gate.yml`) run here, on a caller.

The caller is a training repository made in tmp_path with its own model package `mockpolicy/` (an
MLP actor-critic with a value head, its factories and a probe generator), a gate config written as
a user would and golden baselines blessed from it. Its checkpoint is not in the checkout: an
earlier job "uploaded" it, and the action downloads it. `mockpolicy` is importable only once the
caller's `install` input has run.

`step_runner` executes the shell steps exactly as written, with the environment GitHub gives them;
the `uses:` steps of other actions are emulated here: setup-python puts a fresh interpreter on PATH
(a venv that sees this one's packages through a .pth file, so nothing lands in the dev
environment), download-artifact copies a prepared folder, upload-artifact checks its path and that
no name is used twice in the run, and checkout copies this repository's files.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest
import yaml
from step_runner import (
    StepFailed,
    StepResult,
    StepRunner,
    condition,
    interpolate,
    job_outputs,
    workflow_call_inputs,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
ACTION = REPO_ROOT / "action.yml"
GATE = REPO_ROOT / ".github" / "workflows" / "gate.yml"
CHECKPOINT_ARTIFACT = "mock-policy-checkpoint"
PARITYGATE_REPO = "acme/paritygate"
PARITYGATE_SHA = "0123456789abcdef0123456789abcdef01234567"

# --- the caller's repository --------------------------------------------------------------------

MODELS_PY = '''"""Our policy: an MLP trunk, a policy head and a value head (training only)."""

import torch
from torch import nn


class ActorCritic(nn.Module):
    def __init__(self, obs_dim: int = 6, n_actions: int = 3, hidden: int = 16) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh())
        self.policy_head = nn.Linear(hidden, n_actions)
        self.value_head = nn.Linear(hidden, 1)

    def forward(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.body(obs)
        return {"logits": self.policy_head(h), "value": self.value_head(h).squeeze(-1)}


class Actor(nn.Module):
    def __init__(self, obs_dim: int = 6, n_actions: int = 3, hidden: int = 16) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh())
        self.policy_head = nn.Linear(hidden, n_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.policy_head(self.body(obs))


def build_actor_critic(**kwargs):
    return ActorCritic(**kwargs)


def build_actor(**kwargs):
    return Actor(**kwargs)
'''

PROBES_PY = '''import numpy as np


def sample_observations(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count, 6)).astype(np.float32)
'''

PYPROJECT = """[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "mockpolicy"
version = "0.0.1"

[tool.setuptools]
packages = ["mockpolicy"]
"""

CONFIG = """# Release gate for our PPO policy.
name: mock-policy
family: policy
policy:
  training_factory: mockpolicy.models:build_actor_critic
  inference_factory: mockpolicy.models:build_actor
  factory_kwargs: {obs_dim: 6, n_actions: 3}
  checkpoint: ../checkpoints/mock-policy/policy.safetensors
  training_heads: [value_head]
  policy_output: logits
  input_name: obs
  output_names: [logits]
  action_space: discrete
  probes: {generator: "mockpolicy.probes:sample_observations", count: 32, seed: 0}
golden:
  dir: ../golden
"""

# The caller's own install, offline: the package needs no dependency this environment lacks.
INSTALL = "python -m pip install --no-deps --no-build-isolation -e ."


def _clean_env() -> dict[str, str]:
    """This machine's environment as a runner's: no GitHub or gate variables, no dev venv bin."""
    dev_bins = {str(Path(sys.executable).parent), sysconfig.get_path("scripts")}
    env = {
        k: v for k, v in os.environ.items()
        if not k.startswith(("GITHUB_", "RUNNER_", "PARITYGATE_", "PYTEST_"))
        and k not in ("PYTHONPATH", "VIRTUAL_ENV", "PIP_EXTRA_INDEX_URL")
    }
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if p and p not in dev_bins
    )
    # Everything paritygate needs is installed already (the CPU torch among it), so pip is kept off
    # every index, including the action's torch-index-url. pip reads PIP_NO_BUILD_ISOLATION
    # inverted: "0" turns build isolation off, so builds use the setuptools installed here.
    env["PIP_NO_INDEX"] = "1"
    env["PIP_NO_BUILD_ISOLATION"] = "0"
    return env


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _copy_tracked(source: Path, dest: Path) -> Path:
    """The files of `source` a checkout would have (tracked, and new files not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=source, capture_output=True, check=False,
    )
    if listed.returncode != 0:  # not a git checkout: everything but what a build leaves
        ignore = shutil.ignore_patterns(".git", ".venv", "venv", "build", "dist", "reports",
                                        "demo", "__pycache__", "*.egg-info", ".*_cache")
        return Path(shutil.copytree(source, dest, ignore=ignore))
    for rel in filter(None, listed.stdout.decode().split("\0")):
        src = source / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


@pytest.fixture(scope="module")
def paritygate_checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This repository as GitHub checks out the action: $GITHUB_ACTION_PATH."""
    return _copy_tracked(REPO_ROOT, tmp_path_factory.mktemp("action") / "paritygate")


@pytest.fixture
def python_bin(tmp_path: Path) -> Path:
    """A fresh interpreter for setup-python to put on PATH; it sees this venv's packages."""
    venv = tmp_path / "hostedtoolcache" / "python"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    probe = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, check=True,
    )
    site = Path(probe.stdout.strip())
    dev_sites = dict.fromkeys([sysconfig.get_path("purelib"), sysconfig.get_path("platlib")])
    (site / "dev-packages.pth").write_text("\n".join(dev_sites) + "\n", encoding="utf-8")
    return venv / "bin"


@pytest.fixture(scope="module")
def caller_template(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The caller's checkout with its blessed golden, and the checkpoint artifact beside it."""
    import torch
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("caller")
    workspace = root / "workspace"
    _write(workspace / "pyproject.toml", PYPROJECT)
    _write(workspace / "mockpolicy" / "__init__.py", '"""Our PPO policy."""\n')
    _write(workspace / "mockpolicy" / "models.py", MODELS_PY)
    _write(workspace / "mockpolicy" / "probes.py", PROBES_PY)
    config = _write(workspace / "configs" / "mock-policy.yaml", CONFIG)

    sys.path.insert(0, str(workspace))
    try:
        from mockpolicy.models import ActorCritic  # type: ignore[import-not-found]

        torch.manual_seed(0)
        model = ActorCritic()
    finally:
        sys.path.remove(str(workspace))
        for name in [m for m in sys.modules if m.split(".")[0] == "mockpolicy"]:
            del sys.modules[name]
    artifact = root / "artifacts" / CHECKPOINT_ARTIFACT
    artifact.mkdir(parents=True)
    save_file(model.state_dict(), str(artifact / "policy.safetensors"))

    # The golden baselines were blessed (and committed) when this checkpoint was trained.
    shutil.copytree(artifact, workspace / "checkpoints" / "mock-policy")
    env = {**_clean_env(), "PYTHONPATH": str(workspace)}
    bless = subprocess.run(
        [sys.executable, "-m", "paritygate", "run", str(config), "--update-golden",
         "--report-dir", str(root / "bless"), "-m", "fast"],
        cwd=workspace, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert bless.returncode == 0, bless.stdout + bless.stderr
    shutil.rmtree(workspace / "checkpoints")
    for cache in workspace.rglob("__pycache__"):
        shutil.rmtree(cache)
    assert (workspace / "golden" / "mock-policy" / "logits_agreement.json").is_file()
    return {"workspace": workspace, "artifacts": root / "artifacts"}


@pytest.fixture
def caller(caller_template: dict[str, Path], tmp_path: Path) -> dict[str, Path]:
    """A fresh checkout of the caller for one job."""
    workspace = shutil.copytree(caller_template["workspace"], tmp_path / "workspace")
    return {"workspace": workspace, "artifacts": caller_template["artifacts"]}


class Artifacts:
    """The run's artifact store: download from prepared folders, upload with unique names."""

    def __init__(self, prepared: Path) -> None:
        self.prepared = prepared
        self.uploaded: dict[str, list[str]] = {}

    def download(self, runner: StepRunner, with_: dict[str, str], env: dict[str, str]) -> dict:
        source = self.prepared / with_["name"]
        if not source.is_dir():
            raise StepFailed(f"Artifact not found for name: {with_['name']}")
        shutil.copytree(source, runner.workspace / with_.get("path", "."), dirs_exist_ok=True)
        return {"download-path": str(runner.workspace / with_.get("path", "."))}

    def upload(self, runner: StepRunner, with_: dict[str, str], env: dict[str, str]) -> dict:
        name = with_["name"]
        assert name and not set(name) & set('":<>|*?\\/\r\n'), f"invalid artifact name {name!r}"
        if name in self.uploaded:  # upload-artifact@v4 refuses a name already used in the run
            raise StepFailed(f"an artifact with this name already exists on the run: {name}")
        path = runner.workspace / with_["path"]
        assert path.exists(), f"upload path {path} does not exist"
        # Stored as upload-artifact@v4 lays it out: a single file at the artifact's root.
        store = self.prepared / name
        if path.is_file():
            store.mkdir(parents=True)
            shutil.copyfile(path, store / path.name)
            files = [path.name]
        else:
            shutil.copytree(path, store)
            files = sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())
        self.uploaded[name] = files
        return {"artifact-id": str(len(self.uploaded))}


def _setup_python(python_bin: Path):
    def handler(runner: StepRunner, with_: dict[str, str], env: dict[str, str]) -> dict:
        assert with_["python-version"], with_
        runner.add_path(python_bin)
        return {"python-version": with_["python-version"],
                "python-path": str(python_bin / "python")}

    return handler


def _runner(workspace: Path, temp: Path, handlers: dict[str, Any], *, job: str = "release",
            contexts: dict[str, Any] | None = None) -> StepRunner:
    temp.mkdir(parents=True, exist_ok=True)
    github = {"job": job, "run_id": "4242", "run_attempt": "1", "repository": "acme/trainer",
              "workflow_ref": "acme/trainer/.github/workflows/release.yml@refs/heads/main",
              "event_name": "push"}
    base = {"github": github, "strategy": {"job-index": 0, "job-total": 1}, "matrix": None,
            "runner": {"os": "Linux", "temp": str(temp)}, "secrets": {}, "vars": {}}
    for key, value in (contexts or {}).items():
        base[key] = {**(base.get(key) or {}), **value} if isinstance(value, dict) else value
    return StepRunner(workspace, temp, base_env=_clean_env(), contexts=base, handlers=handlers)


def _action_handlers(python_bin: Path, artifacts: Artifacts) -> dict[str, Any]:
    return {
        "actions/setup-python@v5": _setup_python(python_bin),
        "actions/download-artifact@v4": artifacts.download,
        "actions/upload-artifact@v4": artifacts.upload,
    }


def _imports(python_bin: Path, workspace: Path, module: str) -> bool:
    proc = subprocess.run([str(python_bin / "python"), "-c", f"import {module}"],
                          cwd=workspace.parent, env=_clean_env(), capture_output=True, check=False)
    return proc.returncode == 0


# --- the composite action, end to end ------------------------------------------------------------


def test_action_gates_the_callers_model(
    caller: dict[str, Path], paritygate_checkout: Path, python_bin: Path, tmp_path: Path
) -> None:
    workspace = caller["workspace"]
    artifacts = Artifacts(caller["artifacts"])
    runner = _runner(workspace, tmp_path / "runner-temp", _action_handlers(python_bin, artifacts))
    with_ = {
        "config": "configs/mock-policy.yaml",
        "install": INSTALL,
        "checkpoint-artifact": CHECKPOINT_ARTIFACT,
        "checkpoint-path": "checkpoints/mock-policy",
    }
    assert not _imports(python_bin, workspace, "mockpolicy")

    first = runner.run_action(paritygate_checkout, with_)
    assert first.outcome == "success", first.log
    assert first.outputs["status"] == "pass", first.log
    assert first.outputs["exit-code"] == "0"
    report_dir = workspace / first.outputs["report-dir"]
    report = json.loads((report_dir / "report.json").read_text(encoding="utf-8"))
    assert report["status"] == "pass" and report["name"] == "mock-policy"
    assert Path(first.outputs["report"]) == Path(first.outputs["report-dir"]) / "report.json"
    assert report["checkpoint"]["path"].endswith("checkpoints/mock-policy/policy.safetensors")
    checks = {c["id"]: c["status"] for c in report["checks"]}
    assert checks["logits_agreement"] == "pass" and checks["head_removal"] == "pass", checks
    # paritygate came from the action's own checkout (the ref the caller pinned).
    (dist_info,) = (python_bin.parent / "lib").glob("python*/site-packages/paritygate-*.dist-info")
    url = json.loads((dist_info / "direct_url.json").read_text(encoding="utf-8"))["url"]
    assert url == paritygate_checkout.as_uri(), url
    assert _imports(python_bin, workspace, "mockpolicy")
    summary = runner.summary.read_text(encoding="utf-8")
    assert (report_dir / "report.md").read_text(encoding="utf-8").strip() in summary
    assert sorted(artifacts.uploaded[first.outputs["artifact-name"]]) == sorted(
        str(p.relative_to(report_dir)) for p in report_dir.rglob("*") if p.is_file())

    # The same call again, now with a misspelt key in the config: bad input (exit 2), the step
    # fails, and the report is still uploaded, under a name of its own though the inputs are equal.
    _write(workspace / "configs" / "mock-policy.yaml",
           CONFIG.replace("  policy_output:", "  polcy_output:"))
    broken = runner.run_action(paritygate_checkout, with_)
    assert broken.outcome == "failure"
    assert broken.outputs["status"] == "bad-input", broken.log
    assert broken.outputs["exit-code"] == "2"
    assert broken.outputs["report"] == ""
    assert broken.step("gate").returncode == 2
    assert "policy.polcy_output: unknown key" in broken.step("gate").log
    assert set(artifacts.uploaded) == {first.outputs["artifact-name"],
                                       broken.outputs["artifact-name"]}
    summary = runner.summary.read_text(encoding="utf-8")
    assert "### paritygate: bad-input (configs/mock-policy.yaml)" in summary
    assert "polcy_output" in summary


# --- single steps: status mapping, names, GPU preflight -----------------------------------------


def _action_step(step_id: str) -> dict[str, Any]:
    action = yaml.safe_load(ACTION.read_text(encoding="utf-8"))
    return next(s for s in action["runs"]["steps"] if s.get("id") == step_id)


def _action_contexts(**inputs: str) -> dict[str, Any]:
    action = yaml.safe_load(ACTION.read_text(encoding="utf-8"))
    defaults = {k: str(v.get("default", "")) for k, v in action["inputs"].items()}
    return {"inputs": {**defaults, **inputs}}


@pytest.mark.parametrize(
    ("code", "status"), [(0, "pass"), (1, "fail"), (2, "bad-input"), (3, "error"), (137, "error")]
)
def test_gate_step_maps_exit_code_to_status(tmp_path: Path, code: int, status: str) -> None:
    """The gate step with a stand-in `paritygate` that exits with `code`."""
    fake_bin = tmp_path / "bin"
    stand_in = f"#!/bin/sh\necho 'paritygate: error: stand-in' >&2\nexit {code}\n"
    _write(fake_bin / "paritygate", stand_in)
    (fake_bin / "paritygate").chmod(0o755)
    runner = _runner(tmp_path / "ws", tmp_path / "temp", {})
    (tmp_path / "ws").mkdir()
    runner.add_path(fake_bin)
    steps_ctx = {"settings": {"outputs": {"markexpr": "fast", "report-dir": "reports/x",
                                          "artifact-name": "paritygate-x"}}}
    contexts = {**runner.contexts, **_action_contexts(config="configs/c.yaml"), "steps": steps_ctx}
    outcome, (result,) = runner.run_steps([_action_step("gate")], contexts)
    assert result.returncode == code, result.log
    assert outcome == ("success" if code == 0 else "failure")
    assert result.outputs == {"status": status, "exit-code": str(code), "report": ""}
    assert "paritygate: error: stand-in" in runner.summary.read_text(encoding="utf-8")


def _settings(tmp_path: Path, contexts: dict[str, Any] | None = None, *,
              calls: int = 1, **inputs: str) -> StepResult:
    """The settings step of the last of `calls` identical calls in one job."""
    runner = _runner(tmp_path / "ws", tmp_path / "temp", {}, contexts=contexts)
    (tmp_path / "ws").mkdir(exist_ok=True)
    ctx = {**runner.contexts, **_action_contexts(**inputs)}
    for _ in range(calls):
        _, (result,) = runner.run_steps([_action_step("settings")], ctx)
    return result


def test_artifact_names_never_collide(tmp_path: Path) -> None:
    base = {"config": "configs/my policy.yaml"}
    first = _settings(tmp_path / "a", **base).outputs
    assert first["artifact-name"].startswith("paritygate-release-my-policy-")
    assert first["artifact-name"].endswith("-1-1")  # first call in the job, first attempt
    assert first["report-dir"] == f"reports/paritygate/{first['artifact-name']}"
    assert first["markexpr"] == "fast"
    variants: list[tuple[dict[str, Any] | None, dict[str, Any]]] = [
        (None, {"calls": 2}),  # the same call twice in one job
        (None, {"checkpoint-artifact": "ckpt-2"}),
        (None, {"python-version": "3.12"}),
        ({"strategy": {"job-index": 1}}, {}),
        ({"matrix": {"torch": "2.5"}}, {}),
        ({"github": {"run_attempt": "2"}}, {}),
        ({"github": {"job": "gate-gpu"}}, {}),
        (None, {"config": "configs/other.yaml"}),
    ]
    names = {first["artifact-name"]}
    for i, (contexts, inputs) in enumerate(variants):
        names.add(_settings(tmp_path / str(i), contexts, **{**base, **inputs})
                  .outputs["artifact-name"])
    assert len(names) == len(variants) + 1, names
    given = _settings(tmp_path / "given", **base, **{"artifact-name": "mine", "report-dir": "out"})
    assert given.outputs["artifact-name"] == "mine" and given.outputs["report-dir"] == "out"
    assert _settings(tmp_path / "gpu", **base, gpu="true").outputs["markexpr"] == "gpu"
    empty = _settings(tmp_path / "empty", config="")
    assert empty.returncode == 2 and "the config input is empty" in empty.log


def test_gpu_preflight_fails_without_cuda_or_vllm(python_bin: Path, tmp_path: Path) -> None:
    """On a GPU runner that lacks vLLM or CUDA the job fails; it never skips and passes."""
    runner = _runner(tmp_path / "ws", tmp_path / "temp", {})
    (tmp_path / "ws").mkdir()
    runner.add_path(python_bin)
    ctx = {**runner.contexts, **_action_contexts(config="c.yaml", gpu="true")}
    outcome, (result,) = runner.run_steps([_action_step("preflight")], ctx)
    assert outcome == "failure" and result.returncode == 1, result.log
    assert "gpu is true but this runner lacks CUDA or vLLM" in result.log
    ctx = {**runner.contexts, **_action_contexts(config="c.yaml")}
    _, (skipped,) = runner.run_steps([_action_step("preflight")], ctx)
    assert skipped.outcome == "skipped"


def test_gpu_check_runs_before_the_cuda_install(tmp_path: Path) -> None:
    """With gpu: true a runner without a GPU fails before gigabytes of CUDA torch and vLLM."""
    action = yaml.safe_load(ACTION.read_text(encoding="utf-8"))
    ids = [s.get("id") or s["name"] for s in action["runs"]["steps"]]
    assert ids.index("gpu-check") < ids.index("Install paritygate at the action's ref")
    fake_bin = tmp_path / "bin"
    runner = _runner(tmp_path / "ws", tmp_path / "temp", {})
    (tmp_path / "ws").mkdir()
    runner.add_path(fake_bin)
    ctx = {**runner.contexts, **_action_contexts(config="c.yaml", gpu="true")}
    for listing, code in (("echo 'No devices were found'; exit 6", 1),
                          ("echo 'GPU 0: NVIDIA H100 (UUID: GPU-1)'", 0)):
        _write(fake_bin / "nvidia-smi", f"#!/bin/sh\n{listing}\n")
        (fake_bin / "nvidia-smi").chmod(0o755)
        _, (result,) = runner.run_steps([_action_step("gpu-check")], ctx)
        assert result.returncode == code, result.log
    assert "paritygate: GPU 0: NVIDIA H100" in result.log
    _write(fake_bin / "nvidia-smi", "#!/bin/sh\nexit 6\n")
    _, (failed,) = runner.run_steps([_action_step("gpu-check")], ctx)
    assert "gpu is true but this runner has no NVIDIA GPU" in failed.log
    assert "nothing was installed" in failed.log
    cpu = {**runner.contexts, **_action_contexts(config="c.yaml")}
    _, (skipped,) = runner.run_steps([_action_step("gpu-check")], cpu)
    assert skipped.outcome == "skipped"


# --- the reusable workflow ------------------------------------------------------------------------


def _gate_workflow() -> dict[str, Any]:
    return yaml.safe_load(GATE.read_text(encoding="utf-8"))


def _workflow_contexts(inputs: dict[str, Any], *, called: bool) -> dict[str, Any]:
    gate_ref = f"{PARITYGATE_REPO}/.github/workflows/gate.yml@refs/tags/v1"
    caller_ref = "acme/trainer/.github/workflows/release.yml@refs/heads/main"
    return {
        "inputs": inputs,
        "github": {"job": "cpu", "workflow_ref": caller_ref if called else gate_ref,
                   "repository": "acme/trainer" if called else PARITYGATE_REPO},
        "job": {"workflow_repository": PARITYGATE_REPO, "workflow_sha": PARITYGATE_SHA,
                "workflow_ref": gate_ref},
        "secrets": {"MODEL_STORE_TOKEN": "s3cr3t"} if called else {},
    }


def test_reusable_workflow_gates_the_callers_model(
    caller: dict[str, Path], paritygate_checkout: Path, python_bin: Path, tmp_path: Path
) -> None:
    """gate.yml's CPU job as `workflow_call` from the caller: paritygate checked out at the
    workflow's own commit, the action run from that checkout, the checkpoint downloaded."""
    workflow = _gate_workflow()
    job = workflow["jobs"]["cpu"]
    workspace = caller["workspace"]
    artifacts = Artifacts(caller["artifacts"])
    checkouts: list[dict[str, str]] = []

    def checkout(runner: StepRunner, with_: dict[str, str], env: dict[str, str]) -> dict:
        checkouts.append(with_)
        if not with_.get("repository"):  # the repository under test: the workspace as made
            assert with_["lfs"] == "false"
        else:
            assert with_["repository"] == PARITYGATE_REPO and with_["ref"] == PARITYGATE_SHA
            assert with_["persist-credentials"] == "false"
            shutil.copytree(paritygate_checkout, workspace / with_["path"])
        return {}

    inputs = workflow_call_inputs(workflow, {
        "config": "configs/mock-policy.yaml",
        "install": INSTALL,
        "checkpoint-artifact": CHECKPOINT_ARTIFACT,
        "checkpoint-path": "checkpoints/mock-policy",
        # The caller's model store: a secret-using fetch that runs before the gate.
        "pre-gate": 'test "$MODEL_STORE_TOKEN" = s3cr3t && echo fetched > fetched.txt',
    })
    contexts = _workflow_contexts(inputs, called=True)
    handlers = {**_action_handlers(python_bin, artifacts), "actions/checkout@v4": checkout}
    runner = _runner(workspace, tmp_path / "runner-temp", handlers, job="cpu", contexts=contexts)
    status, results, outputs = runner.run_job(job)
    log = "\n".join(f"--- {r.name}: {r.outcome}\n{r.log}" for r in results)
    assert status == "success", log
    assert len(checkouts) == 2
    assert outputs["status"] == "pass", log
    assert outputs["artifact-name"] in artifacts.uploaded
    assert (workspace / "fetched.txt").read_text(encoding="utf-8").strip() == "fetched"
    assert "paritygate demo" not in log  # the demo is built only when run directly
    assert "logits_agreement" in runner.summary.read_text(encoding="utf-8")


def _gate_with(job_id: str, inputs: dict[str, Any], *, called: bool) -> dict[str, Any]:
    contexts = _workflow_contexts(inputs, called=called)
    step = next(s for s in _gate_workflow()["jobs"][job_id]["steps"] if s.get("id") == "gate")
    return {k: interpolate(v, contexts) for k, v in step["with"].items()}


def test_reusable_workflow_inputs_reach_the_action() -> None:
    workflow = _gate_workflow()
    push = _gate_with("cpu", {}, called=False)
    assert push["config"] == "configs/demo-policy.yaml" and push["pre-gate"] == "paritygate demo"
    assert push["markexpr"] == "fast" and push["artifact-name"] == ""
    called = _gate_with("cpu", workflow_call_inputs(workflow, {"config": "c.yaml"}), called=True)
    assert called["config"] == "c.yaml" and called["pre-gate"] == ""
    assert called["python-version"] == "3.11" and called["extras"] == "all"
    named = workflow_call_inputs(workflow, {"config": "c.yaml", "artifact-name": "ppo"})
    assert _gate_with("cpu", named, called=True)["artifact-name"] == "ppo-cpu"
    assert _gate_with("gpu", named, called=True)["artifact-name"] == "ppo-gpu"
    gpu = _gate_with("gpu", workflow_call_inputs(workflow, {"config": "c.yaml"}), called=True)
    assert gpu["config"] == "c.yaml" and gpu["gpu"] == "true" and gpu["markexpr"] == "gpu"
    assert _gate_with("gpu", {}, called=False)["config"] == "configs/demo-lm.yaml"


@pytest.mark.parametrize("called", [False, True])
def test_rollout_dump_handoff(tmp_path: Path, called: bool) -> None:
    """The GPU job's dump steps (a stand-in `paritygate dump`) upload the dump; the audit job
    downloads it where the dump config reads it, and gates it with that config."""
    workflow = _gate_workflow()
    fake_bin = tmp_path / "bin"
    _write(fake_bin / "paritygate", '#!/bin/sh\n[ "$1" = dump ] && [ "$5" = --engine ] && '
           '[ "$6" = vllm ] && echo "{}" > "$4"\n')
    (fake_bin / "paritygate").chmod(0o755)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    artifacts = Artifacts(tmp_path / "artifacts")
    inputs = workflow_call_inputs(workflow, {"config": "c.yaml", "dump-config": "d.yaml",
                                             "dump-path": "out/r.jsonl"}) if called else {}
    contexts = _workflow_contexts(inputs, called=called)
    runner = _runner(workspace, tmp_path / "temp", _action_handlers(tmp_path, artifacts),
                     job="gpu", contexts=contexts)
    runner.add_path(fake_bin)
    steps = workflow["jobs"]["gpu"]["steps"]
    gate_ctx = {"gate": {"outputs": {"status": "fail", "artifact-name": "pg-gpu"},
                         "outcome": "failure"}}
    start = steps.index(next(s for s in steps if s.get("id") == "dump"))
    _, results = runner.run_steps(steps[start:], {**runner.contexts, "steps": gate_ctx})
    log = "\n".join(r.log for r in results)
    assert [r.outcome for r in results] == ["success", "success"], log
    outputs = job_outputs(workflow["jobs"]["gpu"], runner.contexts, results)
    path = "out/r.jsonl" if called else "rollouts/demo-lm-vllm.jsonl"
    assert outputs["dump-artifact"] == "pg-gpu-vllm-dump"
    assert outputs["dump-dir"] == str(Path(path).parent)
    assert "pg-gpu-vllm-dump" in artifacts.uploaded

    audit = workflow["jobs"]["audit"]
    needs = {"needs": {"gpu": {"outputs": outputs}}}
    assert condition(audit["if"], {**contexts, **needs}, "success")
    assert not condition(audit["if"], {**contexts, "needs": {"gpu": {"outputs": {}}}}, "success")
    download = next(s for s in audit["steps"] if "download-artifact" in str(s.get("uses")))
    with_ = {k: interpolate(v, {**contexts, **needs}) for k, v in download["with"].items()}
    target = tmp_path / "audit-ws"
    target.mkdir()
    audit_runner = _runner(target, tmp_path / "temp2", {}, contexts=contexts)
    artifacts.download(audit_runner, with_, {})
    assert (target / path).is_file()
    step = next(s for s in audit["steps"] if s.get("id") == "gate")
    config = interpolate(step["with"]["config"], {**contexts, **needs})
    assert config == ("d.yaml" if called else "configs/demo-lm-dump.yaml")


def test_no_rollout_dump_without_a_dump_config(tmp_path: Path) -> None:
    workflow = _gate_workflow()
    inputs = workflow_call_inputs(workflow, {"config": "c.yaml"})
    runner = _runner(tmp_path / "ws", tmp_path / "temp", {}, job="gpu",
                     contexts=_workflow_contexts(inputs, called=True))
    (tmp_path / "ws").mkdir()
    steps = workflow["jobs"]["gpu"]["steps"]
    dump = next(s for s in steps if s.get("id") == "dump")
    gate_ctx = {"gate": {"outputs": {"status": "pass", "artifact-name": "pg"}}}
    _, (result,) = runner.run_steps([dump], {**runner.contexts, "steps": gate_ctx})
    assert result.outcome == "success" and result.outputs == {}, result.log
    assert "no dump-config" in result.log
    gate_ctx = {"gate": {"outputs": {"status": "error"}}}  # paritygate was not installed
    _, (result,) = runner.run_steps([dump], {**runner.contexts, "steps": gate_ctx})
    assert result.outcome == "skipped"


@pytest.mark.parametrize(
    ("inputs", "runner_var", "runs"),
    [
        ({}, "", False),  # push where no gpu runner is registered
        ({}, "true", True),  # push where the repository says it has one
        ({"config": "c.yaml"}, "true", False),  # a call leaves the GPU job off by default
        ({"config": "c.yaml", "gpu": True}, "", True),
    ],
)
def test_gpu_job_runs_only_when_asked(inputs: dict[str, Any], runner_var: str, runs: bool) -> None:
    workflow = _gate_workflow()
    if inputs:
        inputs = workflow_call_inputs(workflow, inputs)
    contexts = {**_workflow_contexts(inputs, called=bool(inputs)),
                "vars": {"PARITYGATE_GPU_RUNNER": runner_var} if runner_var else {}}
    assert condition(workflow["jobs"]["gpu"]["if"], contexts, "success") is runs
