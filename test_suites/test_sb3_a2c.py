"""A real Stable-Baselines3 A2C (CartPole-v1) checkpoint gated from ``paritygate init`` (skipped
without stable-baselines3).

A2C is trained inside the test run (seeded, a second or two), once for every test and xdist
worker (``build_once``), with separate actor and critic widths (``net_arch: {pi: [32, 32], vf:
[16]}``) so a config reading only the actor's widths could not load it. ``init`` names the A2C
factories and the dict ``net_arch``; with its one TODO (the probes) filled, the clean checkpoint
passes every policy check and ``rollout_parity`` on CartPole-v1. Faults: the team's export of
the whole policy (the value head left in), and an export from an earlier checkpoint of the
same run (a stale artifact).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from paritygate.gate import Gate
from paritygate.load import config_from_dict

pytest.importorskip("stable_baselines3", reason="stable-baselines3 not installed (extra 'sb3')")

pytestmark = pytest.mark.xdist_group("sb3")

CHECKS = ["weights_load", "batchnorm_export", "head_removal", "dropout_off",
          "logits_agreement", "export_integrity"]
NET_ARCH = {"pi": [32, 32], "vf": [16]}
ROLLOUT = {"env": "CartPole-v1", "seeds": [0, 1, 2], "max_steps": 150}


def _train(out: Path, seed: int = 0) -> None:
    from stable_baselines3 import A2C

    out.mkdir(parents=True, exist_ok=True)
    model = A2C("MlpPolicy", "CartPole-v1", n_steps=8, seed=seed, device="cpu",
                policy_kwargs={"net_arch": NET_ARCH})
    model.learn(200)
    model.save(out / "a2c_early.zip")
    model.learn(1000, reset_num_timesteps=False)
    model.save(out / "a2c_cartpole.zip")
    rng = np.random.default_rng(seed)
    probes = rng.normal(0, [1.0, 0.5, 0.1, 0.5], size=(48, 4)).astype(np.float32)
    np.save(out / "probes.npy", probes)


@pytest.fixture(scope="module")
def a2c_run(build_once: Any) -> Path:
    return build_once("sb3-a2c-cartpole", _train)  # type: ignore[no-any-return]


def _init(run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
          ) -> tuple[dict[str, Any], Path, list[str]]:
    """``paritygate init`` on the zip, its TODOs filled as a user would: the probes file."""
    from paritygate import write_config
    from paritygate.init_infer import find_todos

    monkeypatch.chdir(tmp_path)
    written = write_config(run / "a2c_cartpole.zip", out=Path("configs") / "a2c.yaml")
    data = yaml.safe_load(written.path.read_text())
    data["policy"]["probes"] = {"file": str(run / "probes.npy")}
    assert find_todos(data) == []
    data["checks"] = [*CHECKS, "rollout_parity"]
    data["policy"]["rollout"] = ROLLOUT
    return data, written.path, written.todos


def _export(zip_path: Path, out: Path, whole: bool) -> Path:
    """The team's own export (plain torch.onnx.export, no manifest): the actor path, or
    (``whole``) the whole policy, logits and value."""
    import torch

    from paritygate.adapters.sb3 import a2c_inference_policy, a2c_training_policy
    from paritygate.checkpoints import load_state_dict

    state = load_state_dict(zip_path)
    policy = (a2c_training_policy if whole else a2c_inference_policy)(4, 2, NET_ARCH)
    policy.load_state_dict({k: v for k, v in state.items() if k in policy.state_dict()})
    policy.eval()

    class Served(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.policy = policy

        def forward(self, obs: torch.Tensor) -> Any:
            out = self.policy(obs)
            return (out["logits"], out["value"]) if whole else out

    names = ["logits", "value"] if whole else ["logits"]
    out.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Served(), (torch.zeros(1, 4),), str(out), dynamo=False,
                          input_names=["obs"], output_names=names,
                          dynamic_axes={"obs": {0: "batch"}, **{n: {0: "batch"} for n in names}})
    return out


def test_init_on_an_a2c_zip_names_its_factories_and_passes_in_its_environment(
        a2c_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data, path, todos = _init(a2c_run, tmp_path, monkeypatch)
    assert todos == ["policy.probes.generator"], todos
    policy = data["policy"]
    assert policy["training_factory"] == "paritygate.adapters.sb3:a2c_training_policy"
    assert policy["factory_kwargs"] == {"obs_dim": 4, "n_actions": 2, "net_arch": NET_ARCH}
    assert policy["training_heads"] == ["mlp_extractor.value_net", "value_net"]
    gate = Gate(config_from_dict(data, path), report_dir=tmp_path / "reports")
    results = {cid: gate.evaluate(cid, golden=False) for cid in data["checks"]}
    assert {c: r.status for c, r in results.items()} == dict.fromkeys(data["checks"], "pass"), {
        c: r.message for c, r in results.items() if r.status != "pass"}
    rollout = results["rollout_parity"]
    assert rollout.metrics["episodes"] == 3 and rollout.metrics["steps"] > 0, rollout.metrics


@pytest.mark.parametrize("served,check,kind", [
    ("actor", None, None),
    ("whole", "head_removal", "undeclared_outputs"),
    ("early", "export_integrity", "not_from_checkpoint"),
], ids=["clean", "value-head-exported", "stale-artifact"])
def test_a2c_export_faults_are_named(a2c_run: Path, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch, served: str,
                                     check: str | None, kind: str | None) -> None:
    zip_name = "a2c_early.zip" if served == "early" else "a2c_cartpole.zip"
    artifact = _export(a2c_run / zip_name, tmp_path / "export" / "policy.onnx",
                       whole=served == "whole")
    data, path, _ = _init(a2c_run, tmp_path, monkeypatch)
    data["policy"]["artifact"] = str(artifact)
    data["checks"] = CHECKS
    gate = Gate(config_from_dict(data, path), report_dir=tmp_path / "reports")
    results = {cid: gate.evaluate(cid, golden=False) for cid in CHECKS}
    if check is None:
        assert {c: r.status for c, r in results.items()} == dict.fromkeys(CHECKS, "pass"), {
            c: r.message for c, r in results.items() if r.status != "pass"}
        return
    result = results[check]
    assert result.status == "fail" and kind in result.finding_kinds(), (
        result.finding_kinds(), result.message)


def _torch_artifact(zip_path: Path, out: Path, fmt: str) -> Path:
    """The actor path as the team ships it: ``torch.jit.trace`` saved as ``.pt``, or a
    ``torch.export`` program saved as ``.pt2`` (batch axis dynamic)."""
    import torch

    from paritygate.adapters.sb3 import a2c_inference_policy
    from paritygate.checkpoints import load_state_dict

    policy = a2c_inference_policy(4, 2, NET_ARCH)
    state = load_state_dict(zip_path)
    policy.load_state_dict({k: v for k, v in state.items() if k in policy.state_dict()})
    policy.eval()
    out.parent.mkdir(parents=True, exist_ok=True)
    example = torch.zeros(3, 4)
    if fmt == "torchscript":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit's notice
            torch.jit.save(torch.jit.trace(policy, (example,)), str(out))
    else:
        batch = torch.export.Dim("batch", min=1, max=4096)
        program = torch.export.export(policy, (example,), dynamic_shapes=({0: batch},))
        torch.export.save(program, str(out))
    return out


@pytest.mark.parametrize("fmt,suffix", [("torchscript", ".pt"), ("torch_export", ".pt2")])
@pytest.mark.parametrize("zip_name", ["a2c_cartpole.zip", "a2c_early.zip"],
                         ids=["clean", "stale"])
def test_init_with_a_torch_artifact_declares_its_format(
        a2c_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str, suffix: str,
        zip_name: str) -> None:
    """``init --artifact`` on a TorchScript or ``.pt2`` file writes its ``artifact_format``; a
    ``.pt2`` also gets ``allow_pickle`` as a TODO (torch.export.load unpickles), never set
    silently, and the config is refused until the user answers it. Filled, the clean artifact
    passes every check; one exported from an earlier checkpoint is named stale."""
    from paritygate import write_config
    from paritygate.errors import InputError
    from paritygate.load import load_config

    artifact = _torch_artifact(a2c_run / zip_name, tmp_path / "ship" / f"policy{suffix}", fmt)
    monkeypatch.chdir(tmp_path)
    written = write_config(a2c_run / "a2c_cartpole.zip", out=Path("configs") / "a2c.yaml",
                           artifact=artifact)
    data = yaml.safe_load(written.path.read_text())
    assert data["policy"]["artifact_format"] == fmt
    expected = ["policy.probes.generator"] + (["allow_pickle"] if fmt == "torch_export" else [])
    assert sorted(written.todos) == sorted(expected), written.todos
    if fmt == "torch_export":
        assert "unpickles" in data["allow_pickle"], data["allow_pickle"]
        with pytest.raises(InputError) as refused:
            load_config(written.path)
        assert refused.value.key is not None and "allow_pickle" in str(refused.value.key) + str(
            refused.value), refused.value
        data["allow_pickle"] = True
    data["policy"]["probes"] = {"file": str(a2c_run / "probes.npy")}
    gate = Gate(config_from_dict({**data, "checks": CHECKS}, written.path),
                report_dir=tmp_path / "reports")
    results = {cid: gate.evaluate(cid, golden=False) for cid in CHECKS}
    if zip_name == "a2c_cartpole.zip":
        assert {c: r.status for c, r in results.items()} == dict.fromkeys(CHECKS, "pass"), {
            c: r.message for c, r in results.items() if r.status != "pass"}
        return
    integrity = results["export_integrity"]
    assert integrity.status == "fail" and "not_from_checkpoint" in integrity.finding_kinds(), (
        integrity.finding_kinds(), integrity.message)


# --- A2C over a continuous action space (Pendulum-v1) ------------------------------------------


def _train_pendulum(out: Path, seed: int = 0) -> None:
    from stable_baselines3 import A2C

    out.mkdir(parents=True, exist_ok=True)
    model = A2C("MlpPolicy", "Pendulum-v1", n_steps=8, seed=seed, device="cpu",
                policy_kwargs={"net_arch": [32, 32]})
    model.learn(200)
    model.save(out / "a2c_pendulum_early.zip")
    model.learn(600, reset_num_timesteps=False)
    model.save(out / "a2c_pendulum.zip")
    rng = np.random.default_rng(seed)
    theta = rng.uniform(-np.pi, np.pi, 48)
    probes = np.stack([np.cos(theta), np.sin(theta), rng.uniform(-8, 8, 48)], 1)
    np.save(out / "probes.npy", probes.astype(np.float32))


@pytest.fixture(scope="module")
def a2c_pendulum(build_once: Any) -> Path:
    return build_once("sb3-a2c-pendulum", _train_pendulum)  # type: ignore[no-any-return]


@pytest.mark.parametrize("artifact_from", [None, "a2c_pendulum_early.zip"],
                         ids=["clean-on-the-fly", "stale-artifact"])
def test_init_on_a_continuous_a2c_zip_declares_its_gaussian_and_passes(
        a2c_pendulum: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        artifact_from: str | None) -> None:
    """A Box action space: the Gaussian factories, ``log_std`` a training head, the action box
    read from the zip's data (SB3 clips the mean to it); only the probes are TODO. The clean
    policy passes every check and ``rollout_parity`` on Pendulum-v1; the team's export of an
    earlier checkpoint is named stale."""
    import torch

    from paritygate import write_config
    from paritygate.adapters.sb3 import gaussian_inference_policy
    from paritygate.checkpoints import load_state_dict

    monkeypatch.chdir(tmp_path)
    written = write_config(a2c_pendulum / "a2c_pendulum.zip", out=Path("configs") / "a2c.yaml")
    assert written.todos == ["policy.probes.generator"], written.todos
    data = yaml.safe_load(written.path.read_text())
    policy = data["policy"]
    assert policy["training_factory"] == "paritygate.adapters.sb3:gaussian_training_policy"
    assert policy["factory_kwargs"] == {"obs_dim": 3, "net_arch": [32, 32],
                                        "action_low": [-2.0], "action_high": [2.0]}
    assert policy["training_heads"] == ["mlp_extractor.value_net", "value_net", "log_std"]
    assert policy["distribution"] == {"log_std": "parameter", "log_std_key": "log_std",
                                      "squash": "clip", "action_scale": 2.0,
                                      "action_bias": 0.0}
    policy["probes"] = {"file": str(a2c_pendulum / "probes.npy")}
    checks = [*CHECKS, "rollout_parity"]
    policy["rollout"] = {"env": "Pendulum-v1", "seeds": [0, 1], "max_steps": 60}
    if artifact_from is not None:
        actor = gaussian_inference_policy(3, [-2.0], [2.0], [32, 32])
        state = load_state_dict(a2c_pendulum / artifact_from)
        actor.load_state_dict({k: v for k, v in state.items() if k in actor.state_dict()})
        actor.eval()
        artifact = tmp_path / "export" / "policy.onnx"
        artifact.parent.mkdir(parents=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(actor, (torch.zeros(1, 3),), str(artifact), dynamo=False,
                              input_names=["obs"], output_names=["mean"],
                              dynamic_axes={"obs": {0: "batch"}, "mean": {0: "batch"}})
        policy["artifact"] = str(artifact)
        checks = CHECKS
    gate = Gate(config_from_dict({**data, "checks": checks}, written.path),
                report_dir=tmp_path / "reports")
    results = {cid: gate.evaluate(cid, golden=False) for cid in checks}
    if artifact_from is None:
        assert {c: r.status for c, r in results.items()} == dict.fromkeys(checks, "pass"), {
            c: r.message for c, r in results.items() if r.status != "pass"}
        assert results["rollout_parity"].metrics["episodes"] == 2
        return
    integrity = results["export_integrity"]
    assert integrity.status == "fail" and "not_from_checkpoint" in integrity.finding_kinds(), (
        integrity.finding_kinds(), integrity.message)
