"""A real Stable-Baselines3 PPO policy gated end to end (skipped without stable-baselines3).

PPO is trained on CartPole inside the test (seeded, 1024 steps) behind ``VecNormalize``;
its statistics are the preprocessing, compared between SB3's own normaliser (training)
and a numpy one (serving). The clean policy must pass with zero false alarms: exported
by the team's own script (plain ``torch.onnx.export``, no manifest), blessed once, then
gated again through the real CLI; and exported on the fly under ``--report-dir``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from zoo_checks import zoo_checks

from paritygate.gate import Gate
from paritygate.load import config_from_dict
from paritygate.provenance import sha256_file

pytest.importorskip("stable_baselines3", reason="stable-baselines3 not installed (extra 'sb3')")

pytestmark = pytest.mark.xdist_group("sb3")

POLICY_CHECKS = list(zoo_checks("policy"))


def _train(root: Path, seed: int) -> tuple[Path, Path]:
    """PPO on CartPole behind VecNormalize; returns (zip, VecNormalize stats JSON)."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    from paritygate.adapters.sb3 import save_vecnormalize_stats

    env = VecNormalize(make_vec_env("CartPole-v1", n_envs=1, seed=seed), norm_obs=True,
                       norm_reward=False)
    model = PPO("MlpPolicy", env, n_steps=256, batch_size=64, n_epochs=2, seed=seed,
                device="cpu")
    model.learn(1024)
    zip_path = root / f"ppo_seed{seed}.zip"
    model.save(zip_path)
    stats = save_vecnormalize_stats(env, root / f"vecnormalize_seed{seed}.json")
    env.close()
    return zip_path, stats


def _plain_export(checkpoint: Path, out: Path) -> Path:
    """The team's own export script: the actor alone, plain torch.onnx.export, no manifest."""
    import torch

    from paritygate.adapters.sb3 import inference_policy
    from paritygate.checkpoints import load_state_dict

    policy = inference_policy(obs_dim=4, n_actions=2)
    state = load_state_dict(checkpoint, allow_pickle=False)
    policy.load_state_dict({k: v for k, v in state.items() if k in policy.state_dict()})
    policy.eval()
    out.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(policy, (torch.zeros(1, 4),), str(out), dynamo=False,
                          input_names=["obs"], output_names=["logits"],
                          dynamic_axes={"obs": {0: "batch"}, "logits": {0: "batch"}})
    return out


def _config(root: Path, checkpoint: Path, stats: Path, artifact: Path | None = None,
            name: str = "sb3") -> dict[str, Any]:
    root.mkdir(parents=True, exist_ok=True)
    probes = root / "probes.npy"
    if not probes.exists():
        rng = np.random.default_rng(0)
        np.save(probes, rng.normal(0, [1.0, 0.5, 0.1, 0.5], size=(32, 4)).astype(np.float32))
    policy: dict[str, Any] = {
        "training_factory": "paritygate.adapters.sb3:training_policy",
        "inference_factory": "paritygate.adapters.sb3:inference_policy",
        "factory_kwargs": {"obs_dim": 4, "n_actions": 2},
        "checkpoint": str(checkpoint),
        "training_heads": ["mlp_extractor.value_net", "value_net"],
        "policy_output": "logits",
        "preprocessing": {"training": "paritygate.adapters.sb3:normalize_training",
                          "serving": "paritygate.adapters.sb3:normalize_serving",
                          "stats": str(stats)},
        "probes": {"file": str(probes)},
    }
    if artifact is not None:
        policy["artifact"] = str(artifact)
    return {"name": name, "family": "policy", "checks": POLICY_CHECKS, "policy": policy,
            "golden": {"dir": "golden"}}


def _gate(root: Path, data: dict[str, Any], **kwargs: Any) -> Gate:
    root.mkdir(parents=True, exist_ok=True)
    return Gate(config_from_dict(data, root / "gate.yaml"), **kwargs)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("sb3")
    zip_a, stats_a = _train(root, 0)
    zip_b, stats_b = _train(root, 1)
    return {"root": root, "a": (zip_a, stats_a), "b": (zip_b, stats_b)}


def test_sb3_own_export_without_manifest_passes_after_one_bless(trained: dict[str, Any]) -> None:
    root = trained["root"] / "own-export"
    zip_a, stats_a = trained["a"]
    sha = sha256_file(zip_a)
    artifact = _plain_export(zip_a, root / "export" / "policy.onnx")
    assert not (artifact.parent / "manifest.json").exists()
    config = root / "gate.yaml"
    config.write_text(yaml.safe_dump(_config(root, zip_a, stats_a, artifact)), encoding="utf-8")
    env = {k: v for k, v in os.environ.items()
           if k not in ("GITHUB_STEP_SUMMARY", "PARITYGATE_CONFIG")}
    for args in (["--update-golden"], []):
        proc = subprocess.run(
            [sys.executable, "-m", "paritygate", "run", str(config), "--report-dir",
             str(root / ("bless" if args else "run")), *args],
            cwd=root, capture_output=True, text=True, timeout=300, env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(p.stem for p in (root / "golden" / "sb3").glob("*.json")) == sorted(
        POLICY_CHECKS)
    assert sha256_file(zip_a) == sha


def test_sb3_on_the_fly_export_goes_under_the_report_dir(trained: dict[str, Any]) -> None:
    root = trained["root"] / "on-the-fly"
    zip_a, stats_a = trained["a"]
    gate = _gate(root, _config(root, zip_a, stats_a), report_dir=root / "reports-here")
    for cid in POLICY_CHECKS:
        result = gate.evaluate(cid, golden=False)
        assert result.status == "pass", (cid, result.message)
    assert gate.context.artifact_path == (root / "reports-here" / "export" / "policy.onnx")
    assert (root / "reports-here" / "export" / "manifest.json").exists()


def test_artifact_from_another_sb3_run_fails(trained: dict[str, Any]) -> None:
    root = trained["root"] / "stale"
    (zip_a, stats_a), (zip_b, _) = trained["a"], trained["b"]
    exported = _gate(root / "b", _config(root / "b", zip_b, stats_a), report_dir=root / "b")
    artifact = exported.context.artifact_path  # run B exported on the fly, with its manifest
    gate = _gate(root / "c", _config(root / "c", zip_a, stats_a, artifact))
    stale = gate.evaluate("export_integrity", golden=False)
    assert stale.status == "fail" and "stale artifact" in stale.message
    logits = gate.evaluate("logits_agreement", golden=False)
    assert logits.status == "fail" and "not built from this checkpoint" in logits.message
    # The same artifact from the team's own pipeline: no manifest, provenance disproved.
    own = _plain_export(zip_b, root / "own" / "policy.onnx")
    gate = _gate(root / "d", _config(root / "d", zip_a, stats_a, own))
    stale = gate.evaluate("export_integrity", golden=False)
    assert stale.status == "fail", stale.message
    assert "artifact was not built from this checkpoint" in stale.message
    assert "weight initializers match" in stale.message
