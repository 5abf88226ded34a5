"""Unit level, no training: aliases are found by identity, target networks are heads (and a
Q-network only beside an actor), a torch checkpoint of a deterministic actor gets a
``type: deterministic`` block, and that block refuses a Gaussian's keys."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from paritygate.checkpoints import find_aliases
from paritygate.errors import InputError
from paritygate.init_infer import head_prefixes
from paritygate.load import config_from_dict

STUB = {"training_factory": "m:f", "inference_factory": "m:g", "checkpoint": "c.safetensors",
        "probes": {"generator": "m:p"}, "action_space": "continuous"}


def test_aliases_by_storage_and_by_value_never_by_constant() -> None:
    weight = torch.randn(4, 3)
    state = {"features_extractor.w": weight, "pi_features_extractor.w": weight,
             "vf_copy.w": weight.clone(), "other.w": weight.clone(),
             "zeros_a.b": torch.zeros(4), "zeros_b.b": torch.zeros(4)}
    found = find_aliases(state, {"features_extractor.w", "zeros_a.b"})
    # the same storage; equal values under the same name below the first part; a constant
    # tensor (all zeros) places nothing
    assert found == {"pi_features_extractor.w": "features_extractor.w",
                     "vf_copy.w": "features_extractor.w", "other.w": "features_extractor.w"}
    assert find_aliases(state, {"features_extractor.w"}, by_value=False) == {
        "pi_features_extractor.w": "features_extractor.w"}
    edited = dict(state, **{"vf_copy.w": weight + 1e-3})
    assert "vf_copy.w" not in find_aliases(edited, {"features_extractor.w"})


@pytest.mark.parametrize("keys,heads", [
    (["q_net.q_net.0.weight", "q_net_target.q_net.0.weight"], ["q_net_target"]),  # SB3 DQN
    (["q_network.0.weight", "target_network.0.weight"], ["target_network"]),       # CleanRL DQN
    (["actor.mu.0.weight", "actor_target.mu.0.weight", "critic.qf0.0.weight",
      "critic_target.qf0.0.weight"], ["actor_target", "critic", "critic_target"]),  # SB3 TD3
    (["actor.fc.weight", "qf1.fc.weight", "qf1_target.fc.weight", "target_actor.fc.weight"],
     ["qf1", "qf1_target", "target_actor"]),                                        # CleanRL TD3
])
def test_target_networks_are_heads_and_a_lone_q_network_is_the_policy(
        keys: list[str], heads: list[str]) -> None:
    assert head_prefixes(keys) == heads


def test_init_on_a_td3_torch_checkpoint_proposes_a_deterministic_actor(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from safetensors.torch import save_file

    from paritygate import write_config

    state = {"actor.fc.weight": torch.randn(8, 3), "actor.fc_mu.weight": torch.randn(1, 8),
             "actor.action_scale": torch.tensor([2.0]), "actor.action_bias": torch.tensor([0.0]),
             "qf1.fc.weight": torch.randn(8, 4), "qf1_target.fc.weight": torch.randn(8, 4),
             "target_actor.fc.weight": torch.randn(8, 3)}
    save_file(state, str(tmp_path / "td3_actor.safetensors"))
    monkeypatch.chdir(tmp_path)
    written = write_config(tmp_path / "td3_actor.safetensors", out=Path("configs/td3.yaml"))
    policy = yaml.safe_load(written.path.read_text())["policy"]
    assert policy["action_space"] == "continuous"
    assert policy["training_heads"] == ["qf1", "qf1_target", "target_actor"]
    dist = policy["distribution"]
    assert dist["type"] == "deterministic" and "log_std" not in dist
    assert (dist["action_scale"], dist["action_bias"]) == (2.0, 0.0)
    assert {"policy.distribution.squash", "policy.distribution.serving_output"} <= set(
        written.todos)


def test_a_deterministic_block_refuses_a_gaussians_keys(tmp_path: Path) -> None:
    data = {"name": "x", "family": "policy",
            "policy": {**STUB, "distribution": {"type": "deterministic", "squash": "tanh",
                                                "log_std_clamp": [-5, 2]}}}
    with pytest.raises(InputError) as err:
        config_from_dict(data, tmp_path / "gate.yaml")
    assert err.value.key == "policy.distribution"
    assert "log_std_clamp: a deterministic actor has no log-std" in str(err.value)
    data["policy"]["distribution"].pop("log_std_clamp")
    spec = config_from_dict(data, tmp_path / "gate.yaml").policy
    assert spec is not None and spec.gaussian is None and spec.distribution is not None
