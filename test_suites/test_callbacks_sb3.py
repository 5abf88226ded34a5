"""``paritygate.integrations.sb3.ParityGateCallback`` in a real SB3 PPO run: each zip a
``CheckpointCallback`` saves is gated in a subprocess, numbers go through SB3's logger and the
tracker files; bad input never stops training unless ``stop_on_fail``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("stable_baselines3", reason="stable-baselines3 not installed (extra 'sb3')")

pytestmark = pytest.mark.xdist_group("sb3")


def _config(root: Path, checkpoint: Path) -> Path:
    import numpy as np

    probes = root / "probes.npy"
    np.save(probes, np.random.default_rng(0).normal(0, 0.5, size=(32, 4)).astype(np.float32))
    data = {
        "name": "sb3-callback", "family": "policy",
        "checks": ["weights_load", "head_removal", "dropout_off"],
        "golden": {"dir": str(root / "golden")},
        "policy": {
            "training_factory": "paritygate.adapters.sb3:training_policy",
            "inference_factory": "paritygate.adapters.sb3:inference_policy",
            "factory_kwargs": {"obs_dim": 4, "n_actions": 2},
            "checkpoint": str(checkpoint),
            "training_heads": ["mlp_extractor.value_net", "value_net"],
            "policy_output": "logits",
            "probes": {"file": str(probes)},
        },
    }
    path = root / "gate.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def _model(seed: int = 0) -> Any:
    from stable_baselines3 import PPO

    return PPO("MlpPolicy", "CartPole-v1", n_steps=128, batch_size=64, n_epochs=1, seed=seed,
               device="cpu")


@pytest.fixture(scope="module")
def blessed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sb3-callback")
    model = _model()
    model.learn(128)
    model.save(root / "first.zip")
    config = _config(root, root / "first.zip")
    env = {k: v for k, v in os.environ.items() if k not in ("PARITYGATE_CONFIG", "CI")}
    done = subprocess.run([sys.executable, "-m", "paritygate", "run", str(config),
                           "--update-golden", "--report-dir", str(root / "rep")],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return config


def test_each_saved_zip_is_gated_and_logged(blessed: Path, tmp_path: Path) -> None:
    from stable_baselines3.common.callbacks import CallbackList, CheckpointCallback
    from stable_baselines3.common.logger import configure

    from paritygate.integrations.sb3 import ParityGateCallback

    model = _model(1)
    model.set_logger(configure(str(tmp_path / "log"), ["csv"]))
    saves = tmp_path / "ckpts"
    gate = ParityGateCallback(blessed, save_path=saves)
    model.learn(256, callback=CallbackList([
        CheckpointCallback(save_freq=128, save_path=str(saves), name_prefix="ppo"), gate]))
    assert [(o.checkpoint.name, o.status) for o in gate.outcomes] == [
        ("ppo_128_steps.zip", "pass"), ("ppo_256_steps.zip", "pass")]
    report = json.loads((saves / "paritygate" / "ppo_256_steps" / "report.json")
                        .read_text(encoding="utf-8"))
    assert report["name"] == "sb3-callback" and report["checkpoint"]["path_abs"].endswith(
        "ppo_256_steps.zip")
    logged = (tmp_path / "log" / "progress.csv").read_text(encoding="utf-8")
    assert "paritygate/passed" in logged.splitlines()[0]
    lines = (saves / "paritygate" / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(ln)["step"] for ln in lines] == [128, 256]
    page = (saves / "paritygate" / "history.html").read_text(encoding="utf-8")  # after each gate
    assert "Every gated step passed (2)" in page and 'href="ppo_128_steps/report.md"' in page


@pytest.mark.parametrize("stop_on_fail", [False, True])
def test_bad_input_is_logged_and_training_goes_on_unless_stop_on_fail(
    blessed: Path, tmp_path: Path, stop_on_fail: bool
) -> None:
    from stable_baselines3.common.callbacks import CallbackList, CheckpointCallback

    from paritygate.integrations.sb3 import ParityGateCallback

    data = yaml.safe_load(blessed.read_text(encoding="utf-8"))
    data["policy"]["training_heads"] = ["no_such_head"]
    data["policy"]["factory_kwargs"] = {"obs_dim": 4, "n_actions": 2, "nope": 1}
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data), encoding="utf-8")
    model = _model(2)
    saves = tmp_path / "ckpts"
    gate = ParityGateCallback(bad, save_path=saves, stop_on_fail=stop_on_fail)
    model.learn(256, callback=CallbackList([
        CheckpointCallback(save_freq=128, save_path=str(saves), name_prefix="ppo"), gate]))
    first = gate.outcomes[0]
    assert first.status in ("input_error", "error") and first.line and "\n" not in first.line
    assert len(gate.outcomes) == (1 if stop_on_fail else 2)
    assert model.num_timesteps == (128 if stop_on_fail else 256)


def test_eval_callbacks_new_best_model_is_gated(blessed: Path, tmp_path: Path) -> None:
    import gymnasium as gym
    from stable_baselines3.common.callbacks import EvalCallback

    from paritygate.integrations.sb3 import ParityGateCallback

    model = _model(3)
    gate = ParityGateCallback(blessed)
    best = tmp_path / "best"
    model.learn(256, callback=EvalCallback(
        gym.make("CartPole-v1"), callback_on_new_best=gate, eval_freq=128,
        n_eval_episodes=2, best_model_save_path=str(best), verbose=0))
    assert gate.outcomes and {o.checkpoint for o in gate.outcomes} == {best / "best_model.zip"}
    assert all(o.status == "pass" for o in gate.outcomes), [o.summary() for o in gate.outcomes]
    assert (best / "paritygate" / "best_model" / "report.json").is_file()
