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

from paritygate.config import config_from_dict
from paritygate.gate import Gate

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
