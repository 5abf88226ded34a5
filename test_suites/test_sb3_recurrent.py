"""A real sb3-contrib RecurrentPPO policy gated end to end, recurrent_parity included (skipped
without sb3-contrib).

RecurrentPPO is trained on CartPole (seeded, 256 steps, an LSTM of 16) once per test run
(``build_once``); the training side runs the library's own ``_process_sequence`` (its
episode-start reset), the artifact is the actor step exported by the gate. The clean policy must
pass every check, and an artifact that ignores the episode start fails ``recurrent_parity`` as a
missing reset.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("sb3_contrib", reason="sb3-contrib not installed (extra 'sb3')")

pytestmark = pytest.mark.xdist_group("sb3")

CHECKS = ("weights_load", "batchnorm_export", "head_removal", "dropout_off",
          "preprocessing_parity", "logits_agreement", "recurrent_parity", "export_integrity")
ADAPTER = "paritygate.adapters.sb3"


def _config(folder: Path, artifact: Path | None = None) -> dict[str, Any]:
    return {
        "name": "recurrent-ppo-cartpole",
        "family": "policy",
        "seed": 0,
        "policy": {
            "training_factory": f"{ADAPTER}:recurrent_training_policy",
            "inference_factory": f"{ADAPTER}:recurrent_inference_policy",
            "factory_kwargs": {"obs_dim": 4, "n_actions": 2, "lstm_hidden_size": 16,
                               "net_arch": [16]},
            "checkpoint": str(folder / "rppo.zip"),
            "artifact": str(artifact or folder / "policy.onnx"),
            "training_heads": ["value_net", "mlp_extractor.value_net", "lstm_critic"],
            "policy_output": 0,
            "inputs": ["obs", "h_in", "c_in", "episode_start"],
            "output_names": ["logits", "h_out", "c_out"],
            "recurrent": {
                "states": [{"input": "h_in", "output": "h_out", "shape": [16]},
                           {"input": "c_in", "output": "c_out", "shape": [16]}],
                "episode_start": "episode_start",
            },
            "probes": {"generator": "paritygate.demo.shapes:recurrent_probes", "count": 32},
        },
        "golden": {"dir": str(folder / "golden")},
    }


def _build(folder: Path) -> None:
    from sb3_contrib import RecurrentPPO

    from paritygate.families.policy import export_artifact
    from paritygate.load import config_from_dict

    folder.mkdir(parents=True, exist_ok=True)
    model = RecurrentPPO("MlpLstmPolicy", "CartPole-v1", n_steps=64, batch_size=64, n_epochs=2,
                         seed=0, device="cpu",
                         policy_kwargs={"lstm_hidden_size": 16, "net_arch": [16]})
    model.learn(256)
    model.save(folder / "rppo.zip")
    export_artifact(config_from_dict(_config(folder), folder / "gate.yaml"), folder)


@pytest.fixture(scope="module")
def trained(build_once: Any) -> Path:
    return build_once("recurrent-ppo", lambda out: _build(out / "rppo")) / "rppo"


def _evaluate(config: dict[str, Any], folder: Path) -> dict[str, Any]:
    from paritygate.gate import Gate
    from paritygate.load import config_from_dict

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gate.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    gate = Gate(config_from_dict(config, folder / "gate.yaml"))
    return {cid: gate.evaluate(cid, golden=False) for cid in CHECKS}


def test_trained_recurrent_ppo_passes_every_check(trained: Path, tmp_path: Path) -> None:
    results = _evaluate(_config(trained), tmp_path)
    expected = {cid: "skip" if cid == "preprocessing_parity" else "pass" for cid in CHECKS}
    assert {cid: r.status for cid, r in results.items()} == expected, {
        cid: r.message for cid, r in results.items() if r.status != expected[cid]}
    seq = results["recurrent_parity"]
    assert seq.metrics["first_step_over"] == -1
    assert len(seq.details["per_step_max_abs_diff"]) == 16


def test_recurrent_ppo_artifact_without_reset_is_a_missing_reset(
        trained: Path, tmp_path: Path) -> None:
    import torch

    from paritygate.adapters.sb3 import recurrent_inference_policy
    from paritygate.checkpoints import load_state_dict
    from paritygate.engines.torch_engine import ForwardAdapter
    from paritygate.families.policy.export import export_onnx

    model = recurrent_inference_policy(4, 2, lstm_hidden_size=16, net_arch=[16])

    class NoReset(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.policy = model

        def forward(self, obs: Any, h: Any, c: Any, episode_start: Any) -> Any:
            return self.policy(obs, h, c, 0 * episode_start)

    state = load_state_dict(trained / "rppo.zip", allow_pickle=False)
    model.load_state_dict({k: v for k, v in state.items()
                           if not k.startswith(("value_net", "mlp_extractor.value_net",
                                                "lstm_critic"))})
    names = ["obs", "h_in", "c_in", "episode_start"]
    examples = (torch.zeros(2, 4), torch.zeros(2, 16), torch.zeros(2, 16), torch.zeros(2))
    artifact = export_onnx(ForwardAdapter(NoReset().eval(), names, "positional"), examples,
                           tmp_path / "policy.onnx", input_names=names,
                           output_names=["logits", "h_out", "c_out"])
    results = _evaluate(_config(trained, artifact), tmp_path)
    seq = results["recurrent_parity"]
    assert seq.status == "fail" and "missing_reset" in seq.finding_kinds(), seq.message
    assert "missing reset" in seq.message and "first over tolerance at step" in seq.message


# --- rollout_parity: the state fed back step by step in CartPole-v1 --------------------------


def _rollout_config(folder: Path, artifact: Path | None = None) -> dict[str, Any]:
    data = _config(folder, artifact)
    data["policy"]["rollout"] = {"env": "CartPole-v1", "episodes": 6, "seed": 0,
                                 "max_steps": 200}
    return data



def test_trained_recurrent_ppo_passes_rollout_parity_with_its_state_fed_back(
        trained: Path, tmp_path: Path) -> None:
    from paritygate.gate import Gate
    from paritygate.load import config_from_dict

    gate = Gate(config_from_dict(_rollout_config(trained), tmp_path / "gate.yaml"))
    result = gate.evaluate("rollout_parity", golden=False)
    assert result.status == "pass", result.message
    assert result.metrics["action_agreement"] == 1.0 and result.metrics["episodes"] == 6
    assert result.metrics["max_return_abs_diff"] == 0.0
    serving = gate.context.rollouts.candidate
    # the state moved: each step's incoming state is the previous step's state output
    first = serving[0].incoming_states
    assert float(first[0]["episode_start"][0]) == 1.0 and not first[0]["h_in"].any()
    assert float(first[1]["episode_start"][0]) == 0.0 and first[1]["h_in"].any()
    # the next episode starts from the state the last one left, its flag set
    assert serving[1].incoming_states[0]["h_in"].any()
    assert float(serving[1].incoming_states[0]["episode_start"][0]) == 1.0
