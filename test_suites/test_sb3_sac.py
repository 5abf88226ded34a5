"""A real Stable-Baselines3 SAC policy on Pendulum-v1 gated end to end through the SB3 adapter
(skipped without stable-baselines3).

SAC is trained inside the test run (seeded, 300 steps, 200 of them updates), once for every test
and xdist worker (``build_once``). The clean policy passes every check with its Gaussian judged
in distribution terms (KL, std, deterministic action, behaviour log-prob with the tanh
correction). The team's own export of SB3's deterministic action (``2 * tanh(mean)``) passes; the
same export without the tanh fails, naming the missing squash.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from measured_run import cpu_seconds_now

from paritygate.gate import Gate
from paritygate.load import config_from_dict

pytest.importorskip("stable_baselines3", reason="stable-baselines3 not installed (extra 'sb3')")

pytestmark = pytest.mark.xdist_group("sb3")

CHECKS = ["weights_load", "batchnorm_export", "head_removal", "dropout_off",
          "logits_agreement", "export_integrity"]
NET_ARCH = [32, 32]


def _train(out: Path, seed: int = 0) -> None:
    from stable_baselines3 import SAC

    out.mkdir(parents=True, exist_ok=True)
    model = SAC("MlpPolicy", "Pendulum-v1", learning_starts=100, batch_size=64, buffer_size=1000,
                seed=seed, device="cpu", policy_kwargs={"net_arch": NET_ARCH})
    model.learn(300)
    model.save(out / "sac_pendulum.zip")
    rng = np.random.default_rng(seed)
    theta = rng.uniform(-np.pi, np.pi, 48)
    probes = np.stack([np.cos(theta), np.sin(theta), rng.uniform(-8, 8, 48)], 1)
    np.save(out / "probes.npy", probes.astype(np.float32))


@pytest.fixture(scope="module")
def sac_run(build_once: Any) -> Path:
    return build_once("sb3-sac-pendulum", _train)  # type: ignore[no-any-return]


def _config(run: Path, root: Path, serving_output: str = "mean", **policy: Any) -> Any:
    """The README's SB3 SAC config, pointed at the run's files."""
    data = {
        "name": "sac-pendulum", "family": "policy", "checks": CHECKS,
        "policy": {
            "training_factory": "paritygate.adapters.sb3:sac_training_policy",
            "inference_factory": "paritygate.adapters.sb3:sac_inference_policy",
            "factory_kwargs": {"obs_dim": 3, "action_low": [-2.0], "action_high": [2.0],
                               "net_arch": NET_ARCH},
            "checkpoint": str(run / "sac_pendulum.zip"),
            "training_heads": ["critic", "critic_target"],
            "policy_output": "mean",
            "output_names": ["mean", "log_std"],
            "action_space": "continuous",
            "distribution": {"log_std": "output", "log_std_key": "log_std",
                             "log_std_clamp": [-20, 2], "squash": "tanh", "action_scale": 2.0,
                             "action_bias": 0.0, "serving_output": serving_output},
            "probes": {"file": str(run / "probes.npy")},
            **policy,
        },
        "golden": {"dir": str(root / "golden")},
    }
    root.mkdir(parents=True, exist_ok=True)
    return config_from_dict(data, root / "gate.yaml")


def test_sb3_sac_passes_in_distribution_terms(sac_run: Path, tmp_path: Path) -> None:
    start = cpu_seconds_now()
    gate = Gate(_config(sac_run, tmp_path), report_dir=tmp_path / "reports")
    results = {cid: gate.evaluate(cid, golden=False) for cid in CHECKS}
    cpu = cpu_seconds_now() - start
    assert {c: r.status for c, r in results.items()} == dict.fromkeys(CHECKS, "pass"), {
        c: r.message for c, r in results.items() if r.status != "pass"}
    metrics = results["logits_agreement"].metrics
    for name in ("gaussian_kl_max", "std_max_abs_diff", "action_max_abs_diff",
                 "logprob_delta_max_abs"):
        assert name in metrics and metrics[name] < 1e-4, (name, metrics)
    assert cpu < 300, cpu  # CPU seconds: a loaded machine stretches wall time, not this


def test_sb3_sac_deterministic_action_is_sb3s(sac_run: Path, tmp_path: Path) -> None:
    """``deterministic_action`` of the training side's mean is SB3's own ``predict``."""
    from stable_baselines3 import SAC

    from paritygate.families.policy.distribution import deterministic_action

    gate = Gate(_config(sac_run, tmp_path), report_dir=tmp_path / "reports")
    ctx = gate.context
    ours = deterministic_action(ctx.spec, ctx.reference_outputs)
    sb3, _ = SAC.load(sac_run / "sac_pendulum.zip", device="cpu").predict(
        ctx.probes, deterministic=True)
    np.testing.assert_allclose(ours, sb3, atol=1e-5)


def _own_action_export(run: Path, out: Path, *, tanh: bool) -> Path:
    """The team's export script: SB3's deterministic env action and log_std, plain export."""
    import warnings

    import torch

    from paritygate.adapters.sb3 import sac_inference_policy
    from paritygate.checkpoints import load_state_dict

    policy = sac_inference_policy(3, [-2.0], [2.0], NET_ARCH)
    state = load_state_dict(run / "sac_pendulum.zip")
    policy.load_state_dict({k: v for k, v in state.items() if k in policy.state_dict()})
    policy.eval()

    class Served(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.policy = policy

        def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            mean, log_std = self.policy(obs)
            return 2.0 * (torch.tanh(mean) if tanh else mean), log_std

    out.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Served(), (torch.zeros(1, 3),), str(out), dynamo=False,
                          input_names=["obs"], output_names=["action", "log_std"],
                          dynamic_axes={"obs": {0: "batch"}, "action": {0: "batch"},
                                        "log_std": {0: "batch"}})
    return out


@pytest.mark.parametrize("tanh", [True, False], ids=["clean", "missing-tanh"])
def test_sb3_sac_action_artifact(sac_run: Path, tmp_path: Path, tanh: bool) -> None:
    artifact = _own_action_export(sac_run, tmp_path / "export" / "policy.onnx", tanh=tanh)
    config = _config(sac_run, tmp_path, "action", artifact=str(artifact),
                     output_names=["action", "log_std"])
    result = Gate(config).evaluate("logits_agreement", golden=False)
    if tanh:
        assert result.status == "pass", result.message
    else:
        assert result.status == "fail" and result.reasons[0].finding == "squash_missing", (
            result.message)
        assert "the tanh squash is missing on the serving side" in result.message


def test_init_on_the_sac_zip_proposes_a_config_that_passes(
    sac_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import yaml

    from paritygate import write_config

    monkeypatch.chdir(tmp_path)
    written = write_config(sac_run / "sac_pendulum.zip", out=Path("configs/sac.yaml"))
    # the action box is read from the readable text of the zip's data JSON, never a TODO
    assert written.todos == ["policy.probes.generator"], written.todos
    data = yaml.safe_load(written.path.read_text())
    policy = data["policy"]
    assert policy["factory_kwargs"]["net_arch"] == NET_ARCH
    assert policy["factory_kwargs"]["action_low"] == [-2.0]
    assert policy["factory_kwargs"]["action_high"] == [2.0]
    assert (policy["distribution"]["action_scale"], policy["distribution"]["action_bias"]) == (
        2.0, 0.0)
    policy["probes"] = {"file": str(sac_run / "probes.npy")}
    gate = Gate(config_from_dict({**data, "checks": CHECKS}, written.path),
                report_dir=tmp_path / "reports")
    results = {cid: gate.evaluate(cid, golden=False) for cid in CHECKS}
    assert {c: r.status for c, r in results.items()} == dict.fromkeys(CHECKS, "pass"), {
        c: r.message for c, r in results.items() if r.status != "pass"}


ROLLOUT = {"env": "Pendulum-v1", "seeds": [0, 1, 2], "max_steps": 60}


@pytest.mark.parametrize("tanh", [True, False], ids=["clean", "missing-tanh"])
def test_sb3_sac_rollout_parity(sac_run: Path, tmp_path: Path, tanh: bool) -> None:
    """Closed loop on Pendulum-v1: SB3's deterministic action on both paths; an export without
    the tanh acts 2 * mean, diverges, and the probe-level squash_missing is the root cause."""
    from paritygate.rootcause import explain

    artifact = _own_action_export(sac_run, tmp_path / "export" / "policy.onnx", tanh=tanh)
    config = _config(sac_run, tmp_path, "action", artifact=str(artifact),
                     output_names=["action", "log_std"], rollout=ROLLOUT)
    gate = Gate(config, report_dir=tmp_path / "reports")
    start = cpu_seconds_now()
    rollout = gate.evaluate("rollout_parity", golden=False)
    cpu = cpu_seconds_now() - start
    assert rollout.metrics["episodes"] == 3 and rollout.metrics["steps"] > 0, rollout.metrics
    if tanh:
        assert rollout.status == "pass", rollout.message
        assert rollout.metrics["unexcused_divergences"] == 0
        assert rollout.metrics["max_action_abs_diff"] < 1e-4, rollout.metrics
        assert cpu < 150, cpu  # CPU seconds, not wall
        return
    assert rollout.status == "fail" and rollout.metrics["unexcused_divergences"] >= 1, (
        rollout.message)
    assert rollout.reasons[0].finding == "action_divergence", rollout.message
    logits = gate.evaluate("logits_agreement", golden=False)
    explained, cause = explain([logits, rollout])
    assert logits.status == "fail" and logits.reasons[0].finding == "squash_missing", (
        logits.message)
    assert cause is not None and cause.check == "logits_agreement", cause
    assert "rollout_parity" in cause.explains, cause
    by_id = {r.id: r for r in explained}
    assert by_id["rollout_parity"].message.startswith("see logits_agreement:"), (
        by_id["rollout_parity"].message)
