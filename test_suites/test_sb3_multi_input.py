"""A real Stable-Baselines3 PPO ``MultiInputPolicy`` (Dict observations, ``CombinedExtractor``)
gated end to end through the SB3 adapter (skipped without stable-baselines3).

PPO is trained inside the test run (seeded, 512 steps) on CartPole split into
``{"pos", "vel"}`` behind ``VecNormalize`` on ``vel`` only, once for every test and xdist worker
(``build_once``). The clean policy passes every check; a serving stack without ``vel``'s
normalisation fails preprocessing_parity naming the key; an own export with the two
same-shaped keys wired crosswise fails export_integrity with ``inputs_swapped``.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from measured_run import cpu_seconds_now

from paritygate.gate import Gate
from paritygate.load import config_from_dict

pytest.importorskip("stable_baselines3", reason="stable-baselines3 not installed (extra 'sb3')")

pytestmark = pytest.mark.xdist_group("sb3")

HERE = Path(__file__).resolve().parent
CHECKS = ["weights_load", "batchnorm_export", "head_removal", "dropout_off",
          "preprocessing_parity", "logits_agreement", "export_integrity"]
SPACES = {"pos": [2], "vel": [2]}
NET_ARCH = [32, 32]


def _train(out: Path, seed: int = 0) -> None:
    from sb3_dict_env import make_env
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    from paritygate.adapters.sb3 import save_vecnormalize_stats

    out.mkdir(parents=True, exist_ok=True)
    env = VecNormalize(make_vec_env(make_env, n_envs=1, seed=seed), norm_obs=True,
                       norm_reward=False, norm_obs_keys=["vel"])
    model = PPO("MultiInputPolicy", env, n_steps=128, batch_size=64, n_epochs=2, seed=seed,
                device="cpu", policy_kwargs={"net_arch": NET_ARCH})
    model.learn(512)
    model.save(out / "ppo_dict.zip")
    save_vecnormalize_stats(env, out / "vel_norm.json", key="vel")
    env.close()
    rng = np.random.default_rng(seed)
    np.savez(out / "probes.npz",
             pos=rng.normal(0, [1.0, 0.1], size=(32, 2)).astype(np.float32),
             vel=rng.normal(0, [0.5, 0.5], size=(32, 2)).astype(np.float32))


@pytest.fixture(scope="module")
def dict_run(build_once: Any) -> Path:
    import sys

    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    return build_once("sb3-multi-input-cartpole", _train)  # type: ignore[no-any-return]


def config(run: Path, root: Path, serving: str = "paritygate.adapters.sb3:normalize_serving",
           **policy: Any) -> Any:
    """The README's SB3 MultiInputPolicy config, pointed at the run's files."""
    data = {
        "name": "ppo-dict-cartpole", "family": "policy", "checks": CHECKS,
        "python_path": [str(HERE)],
        "policy": {
            "training_factory": "paritygate.adapters.sb3:multi_input_training_policy",
            "inference_factory": "paritygate.adapters.sb3:multi_input_inference_policy",
            "factory_kwargs": {"spaces": SPACES, "n_actions": 2, "net_arch": NET_ARCH},
            "checkpoint": str(run / "ppo_dict.zip"),
            "training_heads": ["mlp_extractor.value_net", "value_net"],
            "policy_output": "logits",
            "call": "dict",
            "inputs": [
                {"name": "pos", "shape": [2]},
                {"name": "vel", "shape": [2], "preprocessing": {
                    "training": "paritygate.adapters.sb3:normalize_training",
                    "serving": serving,
                    "stats": str(run / "vel_norm.json")}},
            ],
            "output_names": ["logits"],
            "probes": {"file": str(run / "probes.npz")},
            **policy,
        },
        "golden": {"dir": str(root / "golden")},
    }
    root.mkdir(parents=True, exist_ok=True)
    return config_from_dict(data, root / "gate.yaml")


def test_sb3_multi_input_policy_passes_every_check(dict_run: Path, tmp_path: Path) -> None:
    start = cpu_seconds_now()
    gate = Gate(config(dict_run, tmp_path), report_dir=tmp_path / "reports")
    results = {cid: gate.evaluate(cid, golden=False) for cid in CHECKS}
    cpu = cpu_seconds_now() - start
    assert {c: r.status for c, r in results.items()} == dict.fromkeys(CHECKS, "pass"), {
        c: r.message for c, r in results.items() if r.status != "pass"}
    assert results["logits_agreement"].metrics["max_abs_diff"] < 2e-5
    assert results["weights_load"].metrics  # every tensor of policy.pth accounted for
    assert cpu < 300, cpu  # CPU seconds: a loaded machine stretches wall time, not this


def test_sb3_multi_input_training_side_is_sb3s(dict_run: Path, tmp_path: Path) -> None:
    """The adapter's training logits are SB3's own: its greedy action is ``predict``'s."""
    from stable_baselines3 import PPO

    from paritygate.adapters.sb3 import normalize_training

    gate = Gate(config(dict_run, tmp_path), report_dir=tmp_path / "reports")
    ctx = gate.context
    probes = dict(np.load(dict_run / "probes.npz"))
    model = PPO.load(dict_run / "ppo_dict.zip", device="cpu")
    normed = {"pos": probes["pos"],
              "vel": normalize_training(probes["vel"], stats_path=dict_run / "vel_norm.json")}
    sb3, _ = model.predict(normed, deterministic=True)
    ours = np.asarray(ctx.reference_outputs).argmax(-1)
    np.testing.assert_array_equal(ours, sb3)


def test_sb3_multi_input_missing_key_normalisation_is_named(dict_run: Path,
                                                            tmp_path: Path) -> None:
    gate = Gate(config(dict_run, tmp_path, serving="sb3_dict_env:raw_serving"),
                report_dir=tmp_path / "reports")
    result = gate.evaluate("preprocessing_parity", golden=False)
    assert result.status == "fail", result.message
    assert result.message.startswith("input 'vel'"), result.message
    assert result.details["worst_input"] == "vel", result.details
    assert set(result.details["per_input_max_abs_diff"]) == {"vel"}, result.details  # pos: raw
    assert result.reasons[0].finding == "normalisation_missing", result.message


def _swapped_export(run: Path, out: Path) -> Path:
    """The team's own export with the two same-shaped keys wired into each other's input."""
    import torch

    from paritygate.adapters.sb3 import multi_input_inference_policy
    from paritygate.checkpoints import load_state_dict

    policy = multi_input_inference_policy(SPACES, 2, NET_ARCH)
    state = load_state_dict(run / "ppo_dict.zip")
    policy.load_state_dict({k: v for k, v in state.items() if k in policy.state_dict()})
    policy.eval()

    class Served(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.policy = policy

        def forward(self, pos: torch.Tensor, vel: torch.Tensor) -> torch.Tensor:
            return self.policy({"pos": vel, "vel": pos})  # type: ignore[no-any-return]

    out.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Served(), (torch.zeros(1, 2), torch.zeros(1, 2)), str(out),
                          dynamo=False, input_names=["pos", "vel"], output_names=["logits"],
                          dynamic_axes={"pos": {0: "batch"}, "vel": {0: "batch"},
                                        "logits": {0: "batch"}})
    return out


def test_sb3_multi_input_swapped_keys_are_named(dict_run: Path, tmp_path: Path) -> None:
    artifact = _swapped_export(dict_run, tmp_path / "export" / "policy.onnx")
    gate = Gate(config(dict_run, tmp_path, artifact=str(artifact)),
                report_dir=tmp_path / "reports")
    result = gate.evaluate("export_integrity", golden=False)
    assert result.status == "fail", result.message
    assert "inputs_swapped" in result.finding_kinds(), result.message
    assert "only when 'pos' and 'vel' are fed into each other's input" in result.message, (
        result.message)
    assert result.metrics["inputs_swapped"] == 1, result.metrics


def test_init_on_the_dict_zip_proposes_a_config_that_passes(
    dict_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The zip's Dict space (its readable data JSON) gives the keys and shapes: with the
    probes filled in and ``vel``'s normalisation added, every check passes."""
    import yaml

    from paritygate import write_config

    monkeypatch.chdir(tmp_path)
    written = write_config(dict_run / "ppo_dict.zip", out=Path("configs/dict.yaml"))
    assert written.todos == ["policy.probes.generator"], written.todos
    data = yaml.safe_load(written.path.read_text())
    policy = data["policy"]
    assert policy["factory_kwargs"] == {"spaces": SPACES, "n_actions": 2, "net_arch": NET_ARCH}
    assert policy["call"] == "dict"
    assert policy["inputs"] == [{"name": "pos", "shape": [2]}, {"name": "vel", "shape": [2]}]
    policy["inputs"][1]["preprocessing"] = {
        "training": "paritygate.adapters.sb3:normalize_training",
        "serving": "paritygate.adapters.sb3:normalize_serving",
        "stats": str(dict_run / "vel_norm.json")}
    policy["probes"] = {"file": str(dict_run / "probes.npz")}
    gate = Gate(config_from_dict({**data, "checks": CHECKS}, written.path),
                report_dir=tmp_path / "reports")
    results = {cid: gate.evaluate(cid, golden=False) for cid in CHECKS}
    assert {c: r.status for c, r in results.items()} == dict.fromkeys(CHECKS, "pass"), {
        c: r.message for c, r in results.items() if r.status != "pass"}
