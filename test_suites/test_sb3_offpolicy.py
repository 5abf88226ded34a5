"""Real Stable-Baselines3 DQN (CartPole-v1), TD3 and DDPG (Pendulum-v1) checkpoints gated end to end
(skipped without stable-baselines3).

Both are trained inside the test run (seeded, a few hundred steps), once for every test and
xdist worker (``build_once``). DQN's target network is never synced in that time, so it holds
other values than the online ``q_net``: an artifact built from it is named
``target_network_served``, whatever its initializers are called. TD3's deterministic actor
declares its action transform (``distribution: {type: deterministic}``): an export that drops
the rescale or the tanh is named (``action_scale_missing``, ``squash_missing``), never a
"temperature". ``paritygate init`` on each zip gives a config that passes once its one TODO
(the probes) is filled.
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
from paritygate.rootcause import explain

pytest.importorskip("stable_baselines3", reason="stable-baselines3 not installed (extra 'sb3')")

pytestmark = pytest.mark.xdist_group("sb3")

CHECKS = ["weights_load", "batchnorm_export", "head_removal", "dropout_off",
          "logits_agreement", "export_integrity"]
NET_ARCH = [32, 32]


def _train_dqn(out: Path, seed: int = 0) -> None:
    from stable_baselines3 import DQN

    out.mkdir(parents=True, exist_ok=True)
    model = DQN("MlpPolicy", "CartPole-v1", learning_starts=100, train_freq=4, buffer_size=1000,
                batch_size=32, target_update_interval=10**6, seed=seed, device="cpu",
                policy_kwargs={"net_arch": NET_ARCH})
    model.learn(400)
    model.save(out / "dqn_cartpole.zip")
    rng = np.random.default_rng(seed)
    probes = rng.normal(0, [1.0, 0.5, 0.1, 0.5], size=(48, 4)).astype(np.float32)
    np.save(out / "probes.npy", probes)


def _train_td3(out: Path, seed: int = 0) -> None:
    from stable_baselines3 import DDPG, TD3

    out.mkdir(parents=True, exist_ok=True)
    for cls, name in ((TD3, "td3_pendulum.zip"), (DDPG, "ddpg_pendulum.zip")):
        model = cls("MlpPolicy", "Pendulum-v1", learning_starts=100, batch_size=64,
                    buffer_size=1000, seed=seed, device="cpu",
                    policy_kwargs={"net_arch": NET_ARCH})
        model.learn(300 if cls is TD3 else 150)
        model.save(out / name)
    rng = np.random.default_rng(seed)
    theta = rng.uniform(-np.pi, np.pi, 48)
    probes = np.stack([np.cos(theta), np.sin(theta), rng.uniform(-8, 8, 48)], 1)
    np.save(out / "probes.npy", probes.astype(np.float32))


@pytest.fixture(scope="module")
def dqn_run(build_once: Any) -> Path:
    return build_once("sb3-dqn-cartpole", _train_dqn)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def td3_run(build_once: Any) -> Path:
    return build_once("sb3-td3-pendulum", _train_td3)  # type: ignore[no-any-return]


def _export(module: Any, example: Any, out: Path, output: str) -> Path:
    """The team's own export script: plain torch.onnx.export, no manifest."""
    import torch

    out.parent.mkdir(parents=True, exist_ok=True)
    module.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(module, (example,), str(out), dynamo=False, input_names=["obs"],
                          output_names=[output],
                          dynamic_axes={"obs": {0: "batch"}, output: {0: "batch"}})
    return out


def _init(zip_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, probes: Path
          ) -> tuple[dict[str, Any], Path, list[str]]:
    from paritygate import write_config

    monkeypatch.chdir(tmp_path)
    written = write_config(zip_path, out=Path("configs") / f"{zip_path.stem}.yaml")
    data = yaml.safe_load(written.path.read_text())
    data["policy"]["probes"] = {"file": str(probes)}
    data["checks"] = CHECKS
    return data, written.path, written.todos


def _evaluate(data: dict[str, Any], path: Path, tmp_path: Path) -> dict[str, Any]:
    gate = Gate(config_from_dict(data, path), report_dir=tmp_path / "reports")
    return {cid: gate.evaluate(cid, golden=False) for cid in CHECKS}


def _passes(results: dict[str, Any]) -> None:
    assert {c: r.status for c, r in results.items()} == dict.fromkeys(CHECKS, "pass"), {
        c: r.message for c, r in results.items() if r.status != "pass"}


# --- DQN ---------------------------------------------------------------------------------------


def test_init_on_a_dqn_zip_keeps_q_net_as_the_policy_and_passes(
        dqn_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data, path, todos = _init(dqn_run / "dqn_cartpole.zip", tmp_path, monkeypatch,
                              dqn_run / "probes.npy")
    assert todos == ["policy.probes.generator"], todos
    policy = data["policy"]
    assert policy["training_heads"] == ["q_net_target"]
    assert policy["factory_kwargs"] == {"obs_dim": 4, "n_actions": 2, "net_arch": NET_ARCH}
    assert policy["action_space"] == "discrete"
    _passes(_evaluate(data, path, tmp_path))


@pytest.mark.parametrize("source", ["q_net", "q_net_target", "policy:q_net_target"],
                         ids=["clean", "target-served", "target-served-own-names"])
def test_dqn_served_from_its_target_network_is_named(
        dqn_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str) -> None:
    """The team's export script picks the module by attribute; picking ``q_net_target`` ships
    the lagging copy. Its initializers are named ``q_net.0.weight``, like neither; exported
    through the whole policy they keep the checkpoint's own ``q_net_target.*`` names."""
    import torch

    from paritygate.adapters.sb3 import dqn_training_policy
    from paritygate.checkpoints import load_state_dict

    policy = dqn_training_policy(4, 2, NET_ARCH)
    policy.load_state_dict(load_state_dict(dqn_run / "dqn_cartpole.zip"))
    module = getattr(policy, source.split(":")[-1])
    if source.startswith("policy:"):  # the whole policy serves its target network's Q-values
        class TargetServed(type(policy)):  # type: ignore[misc]
            def forward(self, obs: torch.Tensor) -> torch.Tensor:
                return self.q_net_target(obs)  # type: ignore[no-any-return]

        policy.__class__ = TargetServed
        module = policy
    artifact = _export(module, torch.zeros(1, 4), tmp_path / "export" / "policy.onnx",
                       "q_values")
    data, path, _ = _init(dqn_run / "dqn_cartpole.zip", tmp_path, monkeypatch,
                          dqn_run / "probes.npy")
    data["policy"]["artifact"] = str(artifact)
    results = _evaluate(data, path, tmp_path)
    if source == "q_net":
        _passes(results)
        return
    integrity, logits = results["export_integrity"], results["logits_agreement"]
    assert integrity.status == "fail" and "target_network_served" in integrity.finding_kinds()
    assert "q_net_target" in integrity.message, integrity.message
    assert logits.status == "fail" and logits.finding_kinds()[0] == "target_network_served"
    _, cause = explain(list(results.values()))
    assert cause is not None and (cause.check, cause.kind) == (
        "export_integrity", "target_network_served"), cause
    assert "logits_agreement" in cause.explains


# --- TD3 ---------------------------------------------------------------------------------------


def test_init_on_a_td3_zip_declares_the_deterministic_actor_and_passes(
        td3_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data, path, todos = _init(td3_run / "td3_pendulum.zip", tmp_path, monkeypatch,
                              td3_run / "probes.npy")
    assert todos == ["policy.probes.generator"], todos
    policy = data["policy"]
    assert policy["training_heads"] == ["actor_target", "critic", "critic_target"]
    assert policy["action_space"] == "continuous"
    assert policy["distribution"] == {"type": "deterministic", "squash": "tanh",
                                      "action_scale": 2.0, "action_bias": 0.0,
                                      "serving_output": "mean"}
    assert policy["factory_kwargs"]["action_low"] == [-2.0]
    results = _evaluate(data, path, tmp_path)
    _passes(results)
    assert results["logits_agreement"].metrics["action_max_abs_diff"] < 1e-4


def test_init_on_a_ddpg_zip_has_one_critic_and_passes(
        td3_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data, path, todos = _init(td3_run / "ddpg_pendulum.zip", tmp_path, monkeypatch,
                              td3_run / "probes.npy")
    assert todos == ["policy.probes.generator"], todos
    assert data["policy"]["factory_kwargs"]["n_critics"] == 1
    assert data["policy"]["distribution"]["type"] == "deterministic"
    _passes(_evaluate(data, path, tmp_path))


def _td3_action_export(run: Path, out: Path, served: str) -> Path:
    """The team's export of SB3's actor: ``clean`` the env action ``2 * tanh(u)`` (SB3's
    ``unscale_action``), ``no-rescale`` the actor's [-1, 1] output as SB3's export docs give it,
    ``no-tanh`` ``2 * u``."""
    import torch

    from paritygate.adapters.sb3 import td3_inference_policy
    from paritygate.checkpoints import load_state_dict

    policy = td3_inference_policy(3, [-2.0], [2.0], NET_ARCH)
    state = load_state_dict(run / "td3_pendulum.zip")
    policy.load_state_dict({k: v for k, v in state.items() if k in policy.state_dict()})

    class Served(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.policy = policy

        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            u = self.policy(obs)
            if served == "no-rescale":
                return torch.tanh(u)
            return 2.0 * (u if served == "no-tanh" else torch.tanh(u))

    return _export(Served(), torch.zeros(1, 3), out, "action")


@pytest.mark.parametrize("served,kind", [("clean", None), ("no-rescale", "action_scale_missing"),
                                         ("no-tanh", "squash_missing")])
def test_td3_action_transform_faults_are_named(
        td3_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, served: str,
        kind: str | None) -> None:
    artifact = _td3_action_export(td3_run, tmp_path / "export" / "policy.onnx", served)
    data, path, _ = _init(td3_run / "td3_pendulum.zip", tmp_path, monkeypatch,
                          td3_run / "probes.npy")
    policy = data["policy"]
    policy.update(artifact=str(artifact), output_names=["action"])
    policy["distribution"]["serving_output"] = "action"
    if kind is None:  # a correct export of the env action passes every check, head_removal
        # and the per-layer ONNX comparison included (the inference model returns u)
        gate = Gate(config_from_dict(data, path), report_dir=tmp_path / "reports")
        for spec in gate.checks():
            result = gate.evaluate(spec.id, golden=False)
            assert result.status in ("pass", "skip"), (spec.id, result.message)
        return
    gate = Gate(config_from_dict({**data, "checks": ["logits_agreement", "head_removal"]}, path),
                report_dir=tmp_path / "reports")
    logits = gate.evaluate("logits_agreement", golden=False)
    assert logits.status == "fail" and logits.finding_kinds()[0] == kind, logits.message
    assert "temperature" not in logits.message
    _, cause = explain([logits, gate.evaluate("head_removal", golden=False)])
    assert cause is not None and (cause.kind, cause.finding) == ("action_transform", kind)


def test_a_continuous_output_is_never_a_temperature(
        td3_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a declared transform, an artifact serving ``2 * u`` against a training output
    ``u`` is a scale on one side, and the message says where to declare it."""
    artifact = _td3_action_export(td3_run, tmp_path / "export" / "policy.onnx", "no-tanh")
    data, path, _ = _init(td3_run / "td3_pendulum.zip", tmp_path, monkeypatch,
                          td3_run / "probes.npy")
    policy = data["policy"]
    policy.pop("distribution")
    policy.update(artifact=str(artifact), output_names=["action"])
    logits = Gate(config_from_dict({**data, "checks": ["logits_agreement"]}, path)).evaluate(
        "logits_agreement", golden=False)
    assert logits.status == "fail" and list(logits.finding_kinds()) == [
        "artifact_outputs_differ"], logits.message
    assert "temperature" not in logits.message
    assert "an action scale applied on one side only" in logits.message
    assert "policy.distribution" in logits.message


# --- rollout_parity in each one's environment ---------------------------------------------------


@pytest.mark.parametrize("served", ["q_net", "reversed"], ids=["clean", "action-order-reversed"])
def test_dqn_rollout_parity_on_cartpole(
        dqn_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, served: str) -> None:
    """Greedy actions (argmax of the served Q-values) stepped on CartPole-v1 by both paths: the
    online network's export agrees step for step; an export whose Q-values come in the other
    action order (a serving action map reversed) pushes the cart the other way."""
    import torch

    from paritygate.adapters.sb3 import dqn_training_policy
    from paritygate.checkpoints import load_state_dict

    policy = dqn_training_policy(4, 2, NET_ARCH)
    policy.load_state_dict(load_state_dict(dqn_run / "dqn_cartpole.zip"))

    class Served(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q_net = policy.q_net

        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            q = self.q_net(obs)
            return q if served == "q_net" else torch.flip(q, dims=[1])

    artifact = _export(Served(), torch.zeros(1, 4), tmp_path / "export" / "policy.onnx",
                       "q_values")
    data, path, _ = _init(dqn_run / "dqn_cartpole.zip", tmp_path, monkeypatch,
                          dqn_run / "probes.npy")
    data["policy"].update(artifact=str(artifact),
                          rollout={"env": "CartPole-v1", "seeds": [0, 1, 2], "max_steps": 100})
    gate = Gate(config_from_dict({**data, "checks": ["rollout_parity"]}, path),
                report_dir=tmp_path / "reports")
    rollout = gate.evaluate("rollout_parity", golden=False)
    assert rollout.metrics["episodes"] == 3 and rollout.metrics["steps"] > 0, rollout.metrics
    if served == "q_net":
        assert rollout.status == "pass", rollout.message
        assert rollout.metrics["unexcused_divergences"] == 0
        return
    assert rollout.status == "fail" and rollout.reasons[0].finding == "action_divergence", (
        rollout.message)


@pytest.mark.parametrize("served", ["clean", "no-tanh"])
def test_td3_rollout_parity_on_pendulum(
        td3_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, served: str) -> None:
    """TD3's deterministic action ``2 * tanh(u)`` stepped on Pendulum-v1 by both paths; an export
    that drops the tanh acts ``2 * u`` and diverges."""
    artifact = _td3_action_export(td3_run, tmp_path / "export" / "policy.onnx", served)
    data, path, _ = _init(td3_run / "td3_pendulum.zip", tmp_path, monkeypatch,
                          td3_run / "probes.npy")
    policy = data["policy"]
    policy.update(artifact=str(artifact), output_names=["action"],
                  rollout={"env": "Pendulum-v1", "seeds": [0, 1, 2], "max_steps": 60})
    policy["distribution"]["serving_output"] = "action"
    gate = Gate(config_from_dict({**data, "checks": ["rollout_parity"]}, path),
                report_dir=tmp_path / "reports")
    rollout = gate.evaluate("rollout_parity", golden=False)
    assert rollout.metrics["episodes"] == 3 and rollout.metrics["steps"] > 0, rollout.metrics
    if served == "clean":
        assert rollout.status == "pass", rollout.message
        assert rollout.metrics["max_action_abs_diff"] < 1e-4, rollout.metrics
        return
    assert rollout.status == "fail" and rollout.reasons[0].finding == "action_divergence", (
        rollout.message)
