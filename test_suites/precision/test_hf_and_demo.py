"""Hugging Face model directories (causal LM and encoder) and the bundled demo policy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from precision_zoo import FakeContext, measure
from transformers import BertConfig, BertModel, LlamaConfig, LlamaForCausalLM

from paritygate.precision.hf import hf_subject
from paritygate.verdict import judge


def _save(model: torch.nn.Module, path: Path) -> Path:
    model.save_pretrained(path, safe_serialization=True)
    return path


@pytest.mark.parametrize("kind", ["causal_lm", "encoder"])
def test_hf_directory_is_measured_per_layer(kind: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    if kind == "causal_lm":
        config = LlamaConfig(
            vocab_size=128,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
        )
        model, block, output = LlamaForCausalLM(config), "model.layers.1", "lm_head"
    else:
        config = BertConfig(
            vocab_size=128,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=64,
        )
        model, block, output = BertModel(config), "encoder.layer.1", "encoder"
    directory = _save(model, tmp_path / kind)
    ids = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [3, 4, 5, 6, 7, 8, 9, 10, 11]]
    m = measure(FakeContext(hf_subject(directory, ids, pad_token_id=0)))
    result = judge(m, None, use_golden=False)
    assert result.status == "pass", result.message
    assert f"fp16/{block}/local_rel_l2" in m.metrics
    assert f"bf16/{output}/local_rel_l2" in m.metrics


def test_hf_directory_with_tensors_left_at_random_init_is_refused(tmp_path: Path) -> None:
    """AutoModel builds a pooler the saved encoder lacks: refused by name, nothing measured."""
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        max_position_embeddings=64,
    )
    directory = _save(BertModel(config, add_pooling_layer=False), tmp_path / "encoder")
    m = measure(FakeContext(hf_subject(directory, [[5, 6, 7]], pad_token_id=0)))
    result = judge(m, None, use_golden=False)
    assert result.status == "fail"
    assert ("2 model tensors with no checkpoint tensor, left at random init: pooler.dense.bias, "
            "pooler.dense.weight") in result.message
    assert "the checkpoint lacks tensors this model class needs" in result.message
    assert "precision is never measured on random weights" in result.message
    assert not m.metrics and "precision" not in m.details


def test_demo_policy_passes(tmp_path: Path, demo_policy: Path) -> None:
    from paritygate.gate import Gate
    from paritygate.load import load_config

    root = tmp_path
    (root / "demo").mkdir()
    (root / "demo" / "policy").symlink_to(demo_policy, target_is_directory=True)
    config_text = (Path(__file__).parents[2] / "configs" / "demo-policy.yaml").read_text()
    (root / "configs").mkdir()
    (root / "configs" / "demo-policy.yaml").write_text(config_text)
    gate = Gate(load_config(root / "configs" / "demo-policy.yaml"))
    result = gate.evaluate("precision_per_layer", golden=False)
    assert result.status == "pass", result.message
    onnx = result.details["precision"]["onnx"]
    assert onnx["rows"] and onnx["output_rel_l2"] < onnx["output_budget"]
    # modules the exporter folds or drops (dropout, BatchNorm folded into Gemm) are listed
    assert all(u["reason"] for u in onnx["unmapped"])


def test_refusal_names_the_side_that_lacks_tensors() -> None:
    from paritygate.precision.hf import Coverage

    incomplete = Coverage(random_init=["encoder.layer.3.attention.self.query.weight"]).refusal()
    assert incomplete is not None and "1 model tensor with no checkpoint tensor" in incomplete
    assert "the checkpoint lacks tensors this model class needs" in incomplete
    extra = Coverage(unused=["bert.extra_adapter.weight"]).refusal()
    assert extra is not None and "1 checkpoint tensor unused by the model" in extra
    assert "random weights" not in extra and "part of a checkpoint" in extra
    heads = Coverage(unused=["v_head.summary.weight"]).refusal(
        "the architecture (config.json)", heads_key="causal_lm.training_only_heads")
    assert heads is not None
    assert "declare training-only heads in causal_lm.training_only_heads" in heads
    both = Coverage(random_init=["cls.bias"], unused=["pooler.dense.bias"]).refusal()
    assert both is not None and "set hf_model.auto_class to it" in both
    finding = Coverage(random_init=["cls.bias"]).finding()  # weights_load's: no precision
    assert finding is not None and "1 model tensor with no checkpoint tensor" in finding
    assert "the checkpoint lacks tensors" in finding and "precision" not in finding


def test_a_tensor_missing_from_the_checkpoint_is_the_root_cause_of_precision(
    tmp_path: Path,
) -> None:
    """weights_load names the missing tensor (about the weights only); precision_per_layer,
    refused on the same model, is reported as its consequence, not as a second fault."""
    import json

    import numpy as np
    from safetensors.torch import load_file, save_file

    from paritygate.cli import main

    torch.manual_seed(0)
    config = BertConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                        num_attention_heads=2, max_position_embeddings=32)  # fmt: skip
    directory = _save(BertModel(config), tmp_path / "encoder")
    tensors = load_file(directory / "model.safetensors")
    del tensors["encoder.layer.0.output.dense.weight"]
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    np.savez(tmp_path / "probes.npz", input_ids=np.arange(16, dtype=np.int64).reshape(2, 8))
    gate = tmp_path / "gate.yaml"
    gate.write_text("name: enc\nfamily: hf_model\nhf_model:\n  model_dir: encoder\n"
                    "  probes: probes.npz\nprecision: {suggest_mixed: false}\n")  # fmt: skip
    assert main(["run", str(gate), "--report-dir", str(tmp_path / "report")]) == 1
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    root = report["root_cause"]
    assert root["check"] == "weights_load" and root["kind"] == "weights_not_loaded", root
    assert root["explains"] == ["precision_per_layer"]
    assert "encoder.layer.0.output.dense.weight" in root["message"]
    assert "precision" not in root["message"]
    checks = {c["id"]: c for c in report["checks"]}
    assert checks["precision_per_layer"]["consequence_of"] == "weights_load"
    assert checks["precision_per_layer"]["message"].startswith("see weights_load: ")


def _overflowing_llama(down_log2_scale: int) -> LlamaForCausalLM:
    """A tiny Llama whose ``model.layers.1.mlp.up_proj`` is scaled by 2^16: its fp16 output
    overflows. ``down_proj`` scaled by 2^-down_log2_scale: 16 gives the same fp32 function
    (the overflow stays inside the MLP), 0 lets it reach the residual stream."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        initializer_range=0.2)).eval()  # fmt: skip
    mlp = model.model.layers[1].mlp
    with torch.no_grad():
        mlp.up_proj.weight.mul_(2.0**16)
        mlp.down_proj.weight.mul_(2.0**-down_log2_scale)
    return model


IDS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [3, 4, 5, 6, 7, 8, 9, 10, 11]]


def _search(model: LlamaForCausalLM, ranked: list[str]) -> Any:
    from paritygate.engines.generation import left_pad
    from paritygate.precision.hf import select_hf_output
    from paritygate.precision.mixed import MixedRunner, suggest_mixed

    ids, mask = left_pad(IDS, 0)
    modules = {name: m for name, m in model.named_modules() if name}
    runner = MixedRunner(model, [((), {"input_ids": ids, "attention_mask": mask})],
                         select_hf_output, modules)  # fmt: skip
    return suggest_mixed(runner, "float16", ranked, budget=0.01, max_runs=12)


def test_mixed_suggestion_keeps_the_block_of_the_overflow_not_the_decoder(
    tmp_path: Path,
) -> None:
    directory = _save(_overflowing_llama(16), tmp_path / "llama")
    m = measure(FakeContext(hf_subject(directory, IDS, pad_token_id=0)))
    summary = m.details["precision"]["summary"]["float16"]
    assert summary["first_divergent"]["layer"] == "model.layers.1.mlp.up_proj"
    mixed = summary["mixed"]
    assert mixed["verified"] and mixed["keep_fp32"] == ["model.layers.1.mlp"], mixed
    # Every layer holding the overflow measures Inf, so they tie in rank: whichever order
    # they come in, the decoder (most of the model) is not suggested while its block verifies.
    found = _search(_overflowing_llama(16), ["model", "model.layers.1", "model.layers.1.mlp",
                                             "model.layers.1.mlp.up_proj", "lm_head"])  # fmt: skip
    assert found.verified and found.keep_fp32 == ["model.layers.1.mlp"], found.tried
    assert found.output_rel_l2 is not None and found.output_rel_l2 <= 0.01


def test_mixed_suggestion_falls_back_to_the_decoder_when_nothing_smaller_verifies() -> None:
    """The overflow reaches the residual stream: every smaller set hands Inf on in fp16."""
    found = _search(_overflowing_llama(0), ["model", "model.layers.1", "model.layers.1.mlp",
                                            "model.layers.1.mlp.up_proj", "lm_head"])  # fmt: skip
    assert found.verified and found.keep_fp32 == ["model"], found.tried
    passed = [t["keep_fp32"] for t in found.tried
              if t.get("nonfinite") == 0 and t["output_rel_l2"] <= 0.01]  # fmt: skip
    assert passed and all("model" in keep for keep in passed), found.tried


def test_a_suggestion_holding_most_of_the_model_says_the_fix_is_the_scale(
    tmp_path: Path,
) -> None:
    """Keeping the decoder in fp32 is true and useless: the finding says that nothing smaller
    verifies and points at the scale of the first divergent layer instead."""
    directory = _save(_overflowing_llama(0), tmp_path / "llama")
    m = measure(FakeContext(hf_subject(directory, IDS, pad_token_id=0)))
    mixed = m.details["precision"]["summary"]["float16"]["mixed"]
    assert mixed["verified"] and mixed["large"] and mixed["share"] > 0.5, mixed
    finding = next(f.message for f in m.findings
                   if f.kind == "first_divergent_layer" and f.message.startswith("float16"))
    assert "model.layers.1.mlp.up_proj" in finding
    assert "in fp32 verifies: every smaller set hands float16 values beyond its range" in finding
    assert "the fix is the scale of the first divergent layer" in finding
