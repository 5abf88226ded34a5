"""Hugging Face model directories (causal LM and encoder) and the bundled demo policy."""

from __future__ import annotations

from pathlib import Path

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


def test_demo_policy_passes(tmp_path_factory: pytest.TempPathFactory) -> None:
    from paritygate.config import load_config
    from paritygate.demo import policy
    from paritygate.gate import Gate

    root = tmp_path_factory.mktemp("demo")
    policy.build(root / "demo" / "policy")
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
