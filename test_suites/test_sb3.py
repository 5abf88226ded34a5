"""A real Stable-Baselines3 PPO zip gated end to end (skipped without stable-baselines3)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from paritygate.config import config_from_dict
from paritygate.gate import Gate
from paritygate.provenance import sha256_file

pytest.importorskip("stable_baselines3", reason="stable-baselines3 not installed (extra 'sb3')")

POLICY_CHECKS = ["weights_load", "batchnorm_export", "head_removal", "dropout_off",
                 "logits_agreement", "export_integrity"]


def _train(path: Path, seed: int) -> Path:
    from stable_baselines3 import PPO

    model = PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, n_epochs=1, seed=seed,
                device="cpu")
    model.learn(64)
    model.save(path)
    return path


def _config(root: Path, checkpoint: Path, artifact: Path | None = None) -> Gate:
    probes = root / "probes.npy"
    if not probes.exists():
        rng = np.random.default_rng(0)
        np.save(probes, rng.normal(0, [1.0, 0.5, 0.1, 0.5], size=(32, 4)).astype(np.float32))
    policy = {
        "training_factory": "paritygate.adapters.sb3:training_policy",
        "inference_factory": "paritygate.adapters.sb3:inference_policy",
        "factory_kwargs": {"obs_dim": 4, "n_actions": 2},
        "checkpoint": str(checkpoint),
        "training_heads": ["mlp_extractor.value_net", "value_net"],
        "policy_output": "logits",
        "probes": {"file": str(probes)},
    }
    if artifact is not None:
        policy["artifact"] = str(artifact)
    data = {"name": "sb3", "family": "policy", "checks": POLICY_CHECKS, "policy": policy,
            "report_dir": str(root / "report")}
    return Gate(config_from_dict(data, root / "gate.yaml"))


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("sb3")
    return root, _train(root / "ppo_a.zip", 0), _train(root / "ppo_b.zip", 1)


def test_sb3_zip_passes_every_policy_check(trained: tuple[Path, Path, Path]) -> None:
    root, zip_a, _ = trained
    sha = sha256_file(zip_a)
    (root / "a").mkdir()
    gate = _config(root / "a", zip_a)
    for cid in POLICY_CHECKS:
        result = gate.evaluate(cid, golden=False)
        assert result.status == "pass", (cid, result.message)
    assert sha256_file(zip_a) == sha


def test_artifact_from_another_sb3_run_fails(trained: tuple[Path, Path, Path]) -> None:
    root, zip_a, zip_b = trained
    (root / "b").mkdir()
    exported = _config(root / "b", zip_b)
    exported.context  # noqa: B018 - exports the artifact of run B on the fly
    artifact = exported.context.artifact_path
    (root / "c").mkdir()
    gate = _config(root / "c", zip_a, artifact=artifact)
    stale = gate.evaluate("export_integrity", golden=False)
    assert stale.status == "fail" and "stale artifact" in stale.message
    logits = gate.evaluate("logits_agreement", golden=False)
    assert logits.status == "fail" and "artifact logits differ" in logits.message
