"""A real Stable-Baselines3 PPO ``CnnPolicy`` over uint8 images gated end to end (skipped
without stable-baselines3).

SB3 saves its shared features extractor under three names (``features_extractor``,
``pi_features_extractor``, ``vf_features_extractor``), one tensor each: the gate loads and
judges it by identity, so the clean checkpoint passes whether or not the value side's name is
declared a head. A file whose alias names hold different tensors is no longer one module and
fails ``weights_load``. uint8 probes fed to an artifact exported with a float input (SB3's
export docs) are bad input, named before any check runs.
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

from paritygate.gate import Gate
from paritygate.load import config_from_dict

pytest.importorskip("stable_baselines3", reason="stable-baselines3 not installed (extra 'sb3')")

pytestmark = pytest.mark.xdist_group("sb3")

CHECKS = ["weights_load", "batchnorm_export", "head_removal", "dropout_off",
          "logits_agreement", "export_integrity"]
SHAPE = (1, 36, 36)


def _image_env() -> Any:
    import gymnasium as gym

    class Pixels(gym.Env):  # type: ignore[misc]
        """Random 36x36 grey images; action 1 is rewarded (something for PPO to learn)."""

        observation_space = gym.spaces.Box(0, 255, SHAPE, np.uint8)
        action_space = gym.spaces.Discrete(3)

        def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
            super().reset(seed=seed)
            self.t = 0
            return self.np_random.integers(0, 256, SHAPE, dtype=np.uint8), {}

        def step(self, action: Any) -> Any:
            self.t += 1
            obs = self.np_random.integers(0, 256, SHAPE, dtype=np.uint8)
            return obs, float(action == 1), self.t >= 16, False, {}

    return Pixels()


def _train(out: Path, seed: int = 0) -> None:
    from stable_baselines3 import PPO

    out.mkdir(parents=True, exist_ok=True)
    model = PPO("CnnPolicy", _image_env(), n_steps=64, batch_size=32, n_epochs=1, seed=seed,
                device="cpu", policy_kwargs={"features_extractor_kwargs": {"features_dim": 32}})
    model.learn(128)
    model.save(out / "ppo_pixels.zip")
    rng = np.random.default_rng(seed)
    np.save(out / "probes.npy", rng.integers(0, 256, (24, *SHAPE)).astype(np.uint8))


@pytest.fixture(scope="module")
def cnn_run(build_once: Any) -> Path:
    return build_once("sb3-ppo-cnn", _train)  # type: ignore[no-any-return]


def _init(run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
          zip_name: str = "ppo_pixels.zip") -> tuple[dict[str, Any], Path, list[str]]:
    from paritygate import write_config

    monkeypatch.chdir(tmp_path)
    written = write_config(run / zip_name, out=Path("configs") / "ppo-pixels.yaml")
    data = yaml.safe_load(written.path.read_text())
    data["policy"]["probes"] = {"file": str(run / "probes.npy")}
    data["checks"] = CHECKS
    return data, written.path, written.todos


def _results(data: dict[str, Any], path: Path, tmp_path: Path) -> dict[str, Any]:
    gate = Gate(config_from_dict(data, path), report_dir=tmp_path / "reports")
    return {cid: gate.evaluate(cid, golden=False) for cid in CHECKS}


@pytest.mark.parametrize("heads", [None, ["value_net", "vf_features_extractor"]],
                         ids=["init-heads", "alias-declared"])
def test_cnn_policy_passes_judged_by_identity(
        cnn_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        heads: list[str] | None) -> None:
    data, path, todos = _init(cnn_run, tmp_path, monkeypatch)
    assert todos == ["policy.probes.generator"], todos
    policy = data["policy"]
    assert policy["training_heads"] == ["value_net"]
    assert policy["factory_kwargs"]["obs_shape"] == list(SHAPE)
    if heads is not None:
        policy["training_heads"] = heads
    results = _results(data, path, tmp_path)
    assert {c: r.status for c, r in results.items()} == dict.fromkeys(CHECKS, "pass"), {
        c: r.message for c, r in results.items() if r.status != "pass"}
    notes = results["weights_load"].details.get("notes", [])
    assert any("judged by identity" in n for n in notes), notes


def keeps_alias_names(keep_value_net: bool = False, **kwargs: Any) -> Any:
    """A team's own serving model: SB3's policy with the value network deleted but every name
    of the shared extractor kept (``vf_features_extractor`` is the trunk under another name);
    ``keep_value_net``: the fault twin that forgets to delete the value network."""
    from paritygate.adapters.sb3_cnn import _cnn

    cls, kw = _cnn(kwargs["obs_shape"], kwargs["n_actions"], kwargs["features_dim"],
                   kwargs.get("net_arch"), True, True)

    class KeepsAliases(cls):  # type: ignore[misc, valid-type]
        def __init__(self, **k: Any) -> None:
            super().__init__(**k)
            if not keep_value_net:
                del self.value_net
            del self.mlp_extractor.value_net
            self.optimizer = None

        def forward(self, obs: Any) -> Any:  # type: ignore[override]
            return self.action_net(self.mlp_extractor.forward_actor(self.extract_features(obs)))

    return KeepsAliases(**kw)


def keeps_value_net(**kwargs: Any) -> Any:
    return keeps_alias_names(keep_value_net=True, **kwargs)


@pytest.mark.parametrize("factory,kind", [("keeps_alias_names", None),
                                          ("keeps_value_net", "head_left")])
def test_a_head_name_the_trunk_shares_is_not_a_head_left_in(
        cnn_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, factory: str,
        kind: str | None) -> None:
    data, path, _ = _init(cnn_run, tmp_path, monkeypatch)
    data["python_path"] = [str(Path(__file__).resolve().parent)]
    data["policy"]["inference_factory"] = f"test_sb3_cnn:{factory}"
    data["policy"]["training_heads"] = ["value_net", "vf_features_extractor"]
    result = Gate(config_from_dict(data, path), report_dir=tmp_path / "reports").evaluate(
        "head_removal", golden=False)
    if kind is None:
        assert result.status == "pass", result.message
        return
    assert result.status == "fail" and list(result.finding_kinds()) == [kind], result.message
    assert "value_net.weight" in result.message and "features_extractor" not in result.message


def test_alias_names_holding_different_tensors_fail_weights_load(
        cnn_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fault twin: the value side's copy of the extractor edited apart (one tensor nudged),
    so the three names are no longer one module."""
    import torch

    from paritygate.checkpoints import load_state_dict

    state = {k: v.clone() for k, v in load_state_dict(cnn_run / "ppo_pixels.zip").items()}
    state["vf_features_extractor.linear.0.weight"] += 1e-3
    edited = tmp_path / "edited.pt"
    torch.save(state, edited)
    data, path, _ = _init(cnn_run, tmp_path, monkeypatch)
    data["policy"]["checkpoint"] = str(edited)
    gate = Gate(config_from_dict(data, path), report_dir=tmp_path / "reports")
    result = gate.evaluate("weights_load", golden=False)
    assert result.status == "fail", result.message
    assert "unexpected_keys" in result.finding_kinds(), result.message
    assert "vf_features_extractor.linear.0.weight" in result.message


def _float_input_export(run: Path, out: Path) -> Path:
    """SB3's export docs: the actor path traced on a float dummy observation."""
    import torch

    from paritygate.adapters.sb3 import cnn_inference_policy
    from paritygate.checkpoints import load_state_dict

    policy = cnn_inference_policy(list(SHAPE), 3, features_dim=32)
    state = load_state_dict(run / "ppo_pixels.zip")
    policy.load_state_dict({k: v for k, v in state.items() if k in policy.state_dict()})
    policy.eval()
    out.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(policy, (torch.zeros(1, *SHAPE),), str(out), dynamo=False,
                          input_names=["obs"], output_names=["logits"],
                          dynamic_axes={"obs": {0: "batch"}, "logits": {0: "batch"}})
    return out


@pytest.mark.parametrize("probes", ["uint8", "float32"])
def test_uint8_probes_to_a_float_artifact_exit_2_before_any_check(
        cnn_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, probes: str) -> None:
    artifact = _float_input_export(cnn_run, tmp_path / "export" / "policy.onnx")
    data, path, _ = _init(cnn_run, tmp_path, monkeypatch)
    data["policy"]["artifact"] = str(artifact)
    if probes == "float32":  # the clean twin: probes in the artifact's dtype
        floats = tmp_path / "probes_f32.npy"
        np.save(floats, np.load(cnn_run / "probes.npy").astype(np.float32))
        data["policy"]["probes"] = {"file": str(floats)}
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("GITHUB_STEP_SUMMARY",
                                                            "PARITYGATE_CONFIG", "CI")}
    proc = subprocess.run([sys.executable, "-m", "paritygate", "run", str(path), "--report-dir",
                           str(tmp_path / "reports"), "--check", "logits_agreement",
                           "--update-golden"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    if probes == "float32":
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    line = lines[0]
    for part in ("policy.artifact", "policy.probes", "float32", "uint8", "policy.onnx"):
        assert part in line, line
    assert "logits_agreement" not in proc.stdout
