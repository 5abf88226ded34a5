"""Served copies as export and merge tools write them, and trainer code on absolute positions.

- A tied checkpoint served as an untied copy whose ``lm_head.weight`` equals the embedding is
  the same model: ``weights_load`` passes with a note; a copy whose head differs fails it,
  naming the tensor and what it is tied to, with a failing key metric.
- A trainer function without position ids on a model with learned absolute positions (GPT-2)
  fails ``logprob_impl`` by name; the reference function passes on the same model.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from lm_zoo import clean_config

from paritygate.gate import Gate
from paritygate.load import config_from_dict


def _gate(cfg: dict[str, Any], root: Path, name: str) -> Gate:
    cfg["name"] = name
    root.mkdir(parents=True, exist_ok=True)
    return Gate(config_from_dict(cfg, root / "gate.yaml"))


def _set_tied(model_dir: Path, tied: bool) -> None:
    path = model_dir / "config.json"
    data = json.loads(path.read_text())
    data["tie_word_embeddings"] = tied
    path.write_text(json.dumps(data))


@pytest.fixture(scope="module")
def tied_pair(demo_lm: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tied training checkpoint (no lm_head tensor) and its untied served copy (lm_head an
    exact copy of the embedding)."""
    from safetensors.torch import load_file, save_file

    root = tmp_path_factory.mktemp("tied")
    tied, untied = root / "tied", root / "untied"
    shutil.copytree(demo_lm, tied)
    state = load_file(str(tied / "model.safetensors"))
    state.pop("lm_head.weight")
    save_file(state, str(tied / "model.safetensors"), metadata={"format": "pt"})
    _set_tied(tied, True)
    shutil.copytree(tied, untied)
    state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
    save_file(state, str(untied / "model.safetensors"), metadata={"format": "pt"})
    _set_tied(untied, False)
    return tied, untied


def _tied_config(demo_lm: Path, training: Path, served: Path) -> dict[str, Any]:
    cfg = clean_config(demo_lm)
    cfg["causal_lm"]["model_dir"] = str(training)
    cfg["causal_lm"]["engine"]["model_dir"] = str(served)
    return cfg


def test_untied_copy_of_a_tied_head_is_the_same_model(
    demo_lm: Path, tied_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    tied, untied = tied_pair
    gate = _gate(_tied_config(demo_lm, tied, untied), tmp_path, "untied-copy")
    result = gate.evaluate("weights_load", golden=False)
    assert result.status == "pass", result.message
    notes = " ".join(result.details.get("notes", []))
    assert "stores 1 tied tensors separately" in notes
    assert "lm_head.weight = model.embed_tokens.weight" in notes
    logits = gate.evaluate("logits_agreement", golden=False)
    assert logits.status == "pass", logits.message


def test_untied_copy_with_another_head_fails_by_name(
    demo_lm: Path, tied_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    from safetensors.torch import load_file, save_file

    tied, untied = tied_pair
    other = tmp_path / "other-head"
    shutil.copytree(untied, other)
    state = load_file(str(other / "model.safetensors"))
    state["lm_head.weight"] = state["lm_head.weight"] * 1.01
    save_file(state, str(other / "model.safetensors"), metadata={"format": "pt"})
    result = _gate(_tied_config(demo_lm, tied, other), tmp_path, "other-head").evaluate(
        "weights_load", golden=False)
    assert result.status == "fail"
    assert "lm_head.weight (untied from model.embed_tokens.weight)" in result.message
    assert result.key_metric in result.failed_metrics or result.key_metric == (
        "serving_tensors_differing")
    assert result.metrics[result.key_metric] > 0


def test_extra_served_tensor_fails_with_a_failing_key_metric(
    demo_lm: Path, tmp_path: Path
) -> None:
    """A served tensor tied to nothing is a finding, and the key metric shows it."""
    import torch
    from safetensors.torch import load_file, save_file

    extra = tmp_path / "extra"
    shutil.copytree(demo_lm, extra)
    state = load_file(str(extra / "model.safetensors"))
    state["lm_head.bias"] = torch.zeros(state["lm_head.weight"].shape[0])
    save_file(state, str(extra / "model.safetensors"), metadata={"format": "pt"})
    cfg = clean_config(demo_lm)
    cfg["causal_lm"]["engine"]["model_dir"] = str(extra)
    result = _gate(cfg, tmp_path / "g", "extra").evaluate("weights_load", golden=False)
    assert result.status == "fail"
    assert "holds 1 tensors the checkpoint does not have: ['lm_head.bias']" in result.message
    assert result.key_metric == "serving_tensors_extra"
    assert result.metrics["serving_tensors_extra"] == 1


@pytest.fixture(scope="module")
def gpt2_dir(demo_lm: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small GPT-2 (learned absolute positions) with the demo's tokenizer."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    out = tmp_path_factory.mktemp("gpt2") / "model"
    vocab = json.loads((demo_lm / "config.json").read_text())["vocab_size"]
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=256, n_embd=64,
                                       n_layer=2, n_head=2, initializer_range=0.2))
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                 "generation_config.json", "chat_template.jinja"):
        if (demo_lm / name).exists():
            shutil.copy(demo_lm / name, out / name)
    return out


@pytest.mark.parametrize(("fn", "status"), [
    ("lm_zoo_logprobs:no_position_ids", "fail"),
    ("trainer_logprobs:trl_grpo", "fail"),
    ("paritygate.families.causal_lm.logprobs:compute_logprobs", "pass"),
])
def test_absolute_positions_need_position_ids(
    demo_lm: Path, gpt2_dir: Path, tmp_path: Path, fn: str, status: str
) -> None:
    cfg = clean_config(demo_lm)
    lm = cfg["causal_lm"]
    lm["model_dir"] = str(gpt2_dir)
    lm["tokenizer"] = {"training": str(gpt2_dir), "serving": str(gpt2_dir)}
    lm["training"]["logprob_fn"] = fn
    result = _gate(cfg, tmp_path, "gpt2").evaluate("logprob_impl", golden=False)
    assert result.status == status, result.message
    if status == "fail":
        assert "position ids not passed" in result.message
        assert "the fp32/fp32 tier's delta_max_abs" in result.message
