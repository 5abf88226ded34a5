"""A real Stable-Baselines3 PPO ``CnnPolicy`` on an image environment of its own (``BarEnv`` in
``sb3_image_env.py``), gated from ``paritygate init`` (skipped without stable-baselines3).

The policy is trained inside the test run (seeded, seconds). ``init`` on the zip, with its one
TODO (the probes) filled, passes every policy check and ``rollout_parity`` in ``BarEnv``. Where
serving scales the pixels outside the network, the /255 (SB3's ``normalize_images``) is declared
preprocessing: SB3's own ``preprocess_obs`` on the training side, the served path's scaling on
the other; a served path without the /255 fails ``preprocessing_parity`` as
``image_scale_missing`` (its clean twin passes), and its actions diverge in the environment.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from paritygate.gate import Gate
from paritygate.load import config_from_dict

pytest.importorskip("stable_baselines3", reason="stable-baselines3 not installed (extra 'sb3')")

pytestmark = pytest.mark.xdist_group("sb3")

HERE = Path(__file__).resolve().parent
CHECKS = ["weights_load", "batchnorm_export", "head_removal", "dropout_off",
          "logits_agreement", "export_integrity"]
ROLLOUT = {"factory": "sb3_image_env:make_env", "seeds": [0, 1, 2], "max_steps": 40}


def _train(out: Path, seed: int = 0) -> None:
    import sys

    from stable_baselines3 import PPO

    sys.path.insert(0, str(HERE))
    from sb3_image_env import make_env, probes

    out.mkdir(parents=True, exist_ok=True)
    model = PPO("CnnPolicy", make_env(), n_steps=64, batch_size=32, n_epochs=1, seed=seed,
                device="cpu", policy_kwargs={"features_extractor_kwargs": {"features_dim": 32},
                                             "net_arch": [32]})
    model.learn(256)
    model.save(out / "ppo_bar.zip")
    np.save(out / "probes.npy", probes(32, seed))


@pytest.fixture(scope="module")
def bar_run(build_once: Any) -> Path:
    return build_once("sb3-ppo-cnn-bar", _train)  # type: ignore[no-any-return]


def _init(run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
          ) -> tuple[dict[str, Any], Path, list[str]]:
    """``paritygate init`` on the zip, its TODOs filled as a user would (the probes file), and
    the environment to step."""
    from paritygate import write_config
    from paritygate.init_infer import find_todos

    monkeypatch.chdir(tmp_path)
    written = write_config(run / "ppo_bar.zip", out=Path("configs") / "bar.yaml")
    data = yaml.safe_load(written.path.read_text())
    data["policy"]["probes"] = {"file": str(run / "probes.npy")}
    assert find_todos(data) == []
    data["python_path"] = [str(HERE)]
    data["policy"]["rollout"] = ROLLOUT
    return data, written.path, written.todos


def _evaluate(data: dict[str, Any], path: Path, tmp_path: Path,
              checks: list[str]) -> dict[str, Any]:
    gate = Gate(config_from_dict({**data, "checks": checks}, path),
                report_dir=tmp_path / "reports")
    return {cid: gate.evaluate(cid, golden=False) for cid in checks}


def test_cnn_policy_from_init_passes_rollout_parity_in_its_image_env(
        bar_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data, path, todos = _init(bar_run, tmp_path, monkeypatch)
    assert todos == ["policy.probes.generator"], todos
    assert data["policy"]["factory_kwargs"]["obs_shape"] == [1, 36, 36]
    checks = [*CHECKS, "rollout_parity"]
    results = _evaluate(data, path, tmp_path, checks)
    assert {c: r.status for c, r in results.items()} == dict.fromkeys(checks, "pass"), {
        c: r.message for c, r in results.items() if r.status != "pass"}
    rollout = results["rollout_parity"]
    assert rollout.metrics["episodes"] == 3 and rollout.metrics["steps"] == 120, rollout.metrics


@pytest.mark.parametrize("serving", ["paritygate.adapters.sb3_cnn:scale_images_serving",
                                     "sb3_image_env:unscaled_serving"],
                         ids=["clean", "missing-255"])
def test_missing_pixel_scaling_is_named_by_preprocessing_parity(
        bar_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, serving: str) -> None:
    data, path, _ = _init(bar_run, tmp_path, monkeypatch)
    policy = data["policy"]
    policy["factory_kwargs"]["normalize_images"] = False  # the network takes [0, 1] floats
    policy["preprocessing"] = {
        "training": "paritygate.adapters.sb3_cnn:scale_images_training", "serving": serving}
    checks = [*CHECKS, "preprocessing_parity", "rollout_parity"]
    results = _evaluate(data, path, tmp_path, checks)
    if "unscaled" not in serving:
        assert {c: r.status for c, r in results.items()} == dict.fromkeys(checks, "pass"), {
            c: r.message for c, r in results.items() if r.status != "pass"}
        return
    pre = results["preprocessing_parity"]
    assert pre.status == "fail" and pre.finding_kinds()[0] == "image_scale_missing", (
        pre.finding_kinds(), pre.message)
    assert "/255" in pre.message and "normalize_images" in pre.message, pre.message
    rollout = results["rollout_parity"]
    assert rollout.status == "fail", rollout.message
    assert rollout.reasons[0].finding == "action_divergence", rollout.message


# --- MultiInputPolicy with an image key -------------------------------------------------------


def _train_dict(out: Path, seed: int = 0) -> None:
    import sys

    from stable_baselines3 import PPO

    sys.path.insert(0, str(HERE))
    from sb3_image_env import dict_probes, make_dict_env

    out.mkdir(parents=True, exist_ok=True)
    model = PPO("MultiInputPolicy", make_dict_env(), n_steps=64, batch_size=32, n_epochs=1,
                seed=seed, device="cpu",
                policy_kwargs={"features_extractor_kwargs": {"cnn_output_dim": 32},
                               "net_arch": [32]})
    model.learn(128)
    model.save(out / "ppo_bar_dict.zip")
    np.savez(out / "probes.npz", **dict_probes(32, seed))


@pytest.fixture(scope="module")
def bar_dict_run(build_once: Any) -> Path:
    return build_once("sb3-ppo-multi-input-bar", _train_dict)  # type: ignore[no-any-return]


@pytest.mark.parametrize("serving", [None, "paritygate.adapters.sb3_cnn:scale_images_serving",
                                     "sb3_image_env:unscaled_serving"],
                         ids=["in-network", "declared-clean", "declared-missing-255"])
def test_multi_input_image_key_from_init(
        bar_dict_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        serving: str | None) -> None:
    """``init`` on a ``MultiInputPolicy`` zip with an image key names it (``image_keys``, its
    ``cnn_output_dim`` from the tensors); with the probes filled it passes. The /255 declared as
    the image key's own preprocessing: a served path without it is ``image_scale_missing`` on
    that input."""
    from paritygate import write_config

    monkeypatch.chdir(tmp_path)
    written = write_config(bar_dict_run / "ppo_bar_dict.zip", out=Path("configs") / "dict.yaml")
    assert written.todos == ["policy.probes.generator"], written.todos
    data = yaml.safe_load(written.path.read_text())
    policy = data["policy"]
    assert policy["factory_kwargs"]["image_keys"] == ["image"]
    assert policy["factory_kwargs"]["cnn_output_dim"] == 32
    policy["probes"] = {"file": str(bar_dict_run / "probes.npz")}
    data["python_path"] = [str(HERE)]
    checks = list(CHECKS)
    if serving is not None:
        policy["factory_kwargs"]["normalize_images"] = False
        image = next(i for i in policy["inputs"] if i["name"] == "image")
        image["preprocessing"] = {
            "training": "paritygate.adapters.sb3_cnn:scale_images_training", "serving": serving}
        checks.append("preprocessing_parity")
    results = _evaluate(data, written.path, tmp_path, checks)
    if serving is None or "unscaled" not in serving:
        assert {c: r.status for c, r in results.items()} == dict.fromkeys(checks, "pass"), {
            c: r.message for c, r in results.items() if r.status != "pass"}
        return
    pre = results["preprocessing_parity"]
    assert pre.status == "fail" and pre.finding_kinds()[0] == "image_scale_missing", (
        pre.finding_kinds(), pre.message)
    assert "input 'image':" in pre.message, pre.message
