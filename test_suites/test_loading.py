"""Checkpoint formats and ``paritygate export``."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import pytest
import torch

from paritygate.checkpoints import has_nonfinite, load_state_dict
from paritygate.cli import main
from paritygate.errors import InputError
from paritygate.provenance import sha256_file


def _state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {"fc.weight": torch.randn(3, 4), "fc.bias": torch.zeros(3)}


def test_torch_file_weights_only(tmp_path: Path) -> None:
    p = tmp_path / "c.pt"
    torch.save({"state_dict": _state(), "step": 10}, p)
    loaded = load_state_dict(p)
    assert set(loaded) == {"fc.weight", "fc.bias"}


def test_training_checkpoint_state_dict_found_by_name_or_key(tmp_path: Path) -> None:
    from paritygate.checkpoints import load_checkpoint_state

    p = tmp_path / "train.pt"
    optimizer = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))])
    torch.save({"model": _state(), "optimizer": optimizer.state_dict(), "step": 7}, p)
    state, key = load_checkpoint_state(p)
    assert set(state) == {"fc.weight", "fc.bias"} and key == "model"
    nested = tmp_path / "nested.pt"
    torch.save({"agent": {"actor": _state(), "critic": {"v": torch.zeros(1)}}, "step": 7}, nested)
    with pytest.raises(InputError) as exc:
        load_checkpoint_state(nested)
    line = exc.value.line()
    assert line.startswith(f"{nested}: policy.state_dict_key: ") and "top-level keys: agent, step" \
        in line, line
    state, key = load_checkpoint_state(nested, state_dict_key="agent.actor")
    assert key == "agent.actor" and torch.equal(state["fc.weight"], _state()["fc.weight"])
    with pytest.raises(InputError) as exc:
        load_checkpoint_state(nested, state_dict_key="agent.policy")
    assert "'agent.policy' is not in the checkpoint (keys of agent: actor, critic)" in str(
        exc.value.line())


def test_sb3_zip_layout(tmp_path: Path) -> None:
    buf = io.BytesIO()
    torch.save(_state(), buf)
    p = tmp_path / "ppo_agent.zip"
    with zipfile.ZipFile(p, "w") as zf:
        zf.writestr("data", json.dumps({"policy_class": "ActorCriticPolicy"}))
        zf.writestr("policy.pth", buf.getvalue())
    sha = sha256_file(p)
    loaded = load_state_dict(p)
    assert torch.equal(loaded["fc.weight"], _state()["fc.weight"])
    assert sha256_file(p) == sha


def test_not_a_state_dict(tmp_path: Path) -> None:
    p = tmp_path / "c.pt"
    torch.save([1, 2, 3], p)
    with pytest.raises(InputError, match="no state_dict"):
        load_state_dict(p)


def linked_demo(tmp_path: Path, demo_policy: Path) -> Path:
    """``tmp_path/demo``: the shared demo policy (built once per test run), linked."""
    demo = tmp_path / "demo"
    demo.symlink_to(demo_policy, target_is_directory=True)
    return demo


def test_export_command_writes_artifact_and_manifest(tmp_path: Path, capsys,
                                                      demo_policy: Path) -> None:
    demo = linked_demo(tmp_path, demo_policy)
    cfg = tmp_path / "gate.yaml"
    cfg.write_text(
        "name: exp\nfamily: policy\npolicy:\n"
        "  training_factory: paritygate.demo.policy:build_training_model\n"
        "  inference_factory: paritygate.demo.policy:build_inference_model\n"
        "  checkpoint: demo/policy.safetensors\n"
        "  training_heads: [value_head, aux_head]\n"
        "  policy_output: logits\n"
        "  probes: {generator: 'paritygate.demo.policy:probe_observations', count: 8}\n"
    )
    sha = sha256_file(demo / "policy.safetensors")
    out = tmp_path / "export"
    assert main(["export", str(cfg), "--out", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["checkpoint_sha256"] == sha
    assert manifest["artifact_sha256"] == sha256_file(out / "policy.onnx")
    assert manifest["opset"] == 18
    assert sha256_file(demo / "policy.safetensors") == sha
    import onnx

    model = onnx.load(str(out / "policy.onnx"))
    assert [o.name for o in model.graph.output] == ["logits"]
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param


def test_golden_life_cycle_and_probe_set_drift(tmp_path: Path, demo_policy: Path) -> None:
    from paritygate.gate import Gate
    from paritygate.load import config_from_dict

    demo = linked_demo(tmp_path, demo_policy)

    def gate(seed: int, update: bool = False) -> Gate:
        data = {
            "name": "life",
            "family": "policy",
            "checks": ["logits_agreement"],
            "golden": {"dir": str(tmp_path / "golden")},
            "policy": {
                "training_factory": "paritygate.demo.policy:build_training_model",
                "inference_factory": "paritygate.demo.policy:build_inference_model",
                "checkpoint": str(demo / "policy.safetensors"),
                "artifact": str(demo / "policy.onnx"),
                "training_heads": ["value_head", "aux_head"],
                "policy_output": "logits",
                "probes": {"generator": "paritygate.demo.policy:probe_observations", "seed": seed},
            },
        }
        return Gate(config_from_dict(data, tmp_path / "gate.yaml"), update_golden=update)

    first = gate(0).evaluate("logits_agreement")
    assert first.status == "fail" and "no golden baseline" in first.message
    assert (tmp_path / "golden" / "life" / "logits_agreement.obtained.json").exists()
    assert "--update-golden" in first.message
    blessed = gate(0, update=True).evaluate("logits_agreement")
    assert blessed.status == "pass" and "golden blessed" in blessed.message
    record = json.loads((tmp_path / "golden" / "life" / "logits_agreement.json").read_text())
    assert record["provenance"]["checkpoint_sha256"] == sha256_file(demo / "policy.safetensors")
    assert not (tmp_path / "golden" / "life" / "logits_agreement.obtained.json").exists()
    assert gate(0).evaluate("logits_agreement").status == "pass"
    drifted = gate(1).evaluate("logits_agreement")
    assert drifted.status == "fail" and "probe set changed" in drifted.message


def test_has_nonfinite_finds_every_nan_and_inf_and_survives_an_overflowing_sum() -> None:
    clean = torch.randn(1000)
    assert not has_nonfinite(clean)
    for bad in (float("nan"), float("inf"), float("-inf")):
        t = clean.clone()
        t[517] = bad
        assert has_nonfinite(t), bad
        assert has_nonfinite(t.half()), bad
    both = clean.clone()
    both[1], both[2] = float("inf"), float("-inf")  # a sum of NaN, not Inf
    assert has_nonfinite(both)
    huge = torch.full((10,), 3.0e38)  # finite values whose sum overflows: exact check, finite
    assert not has_nonfinite(huge)
    assert not has_nonfinite(torch.full((100,), 60000.0, dtype=torch.float16))
    assert not has_nonfinite(torch.arange(10))  # integers hold no NaN
    assert not has_nonfinite(torch.empty(0))
