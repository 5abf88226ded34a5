"""``paritygate init`` on an HF model directory: inspect, fill the TODOs, bless, run."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

from paritygate import Gate, write_config
from paritygate.errors import InputError
from paritygate.init import head_prefixes

REPO = Path(__file__).resolve().parents[2]


def test_init_on_the_demo_lm_fill_bless_run(
    demo_lm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    written = write_config(demo_lm, out=Path("configs/lm.yaml"), name="lm-init")
    assert written.todos == ["causal_lm.tokenizer.serving", "causal_lm.sampling.training",
                             "causal_lm.probes", "causal_lm.training.logprob_fn"]
    data = yaml.safe_load(written.path.read_text(encoding="utf-8"))
    section = data["causal_lm"]
    assert section["training_only_heads"] == ["v_head."]
    assert section["sampling"]["serving"].endswith("model/generation_config.json")
    assert section["tokenizer"]["training"] == section["model_dir"]
    with pytest.raises(InputError) as refused:
        Gate.from_path(written.path)
    assert refused.value.key == "causal_lm.tokenizer.serving"
    assert "still TODO" in refused.value.cause

    shutil.copy(REPO / "configs" / "sampling" / "demo-lm-train.yaml", "configs/trainer.yaml")
    shutil.copy(REPO / "golden" / "demo-lm" / "probes.jsonl", "configs/probes.jsonl")
    text = written.path.read_text(encoding="utf-8")
    for key, value in {
        "serving": section["model_dir"],
        "training": "trainer.yaml",
        "probes": "probes.jsonl",
        "logprob_fn": "paritygate.families.causal_lm.logprobs:compute_logprobs",
    }.items():
        text, n = re.subn(rf'({key}: )"TODO(?:[^"\\]|\\.)*"', rf"\g<1>{value}", text, count=1)
        assert n == 1, key
    written.path.write_text(text, encoding="utf-8")
    for bless in (True, False):
        gate = Gate.from_path(written.path, update_golden=bless)
        results = [gate.evaluate(c.id) for c in gate.checks() if "gpu" not in c.marks]
        assert results and all(r.status in ("pass", "skip") for r in results), [
            (r.id, r.status, r.message) for r in results if r.status not in ("pass", "skip")]
    assert (tmp_path / "golden" / "lm-init" / "logprob_delta.json").is_file()


BERT_KEYS = [
    "embeddings.word_embeddings.weight",
    *(f"encoder.layer.{i}.attention.self.{proj}.{p}" for i in range(2)
      for proj in ("query", "key", "value") for p in ("weight", "bias")),
    "encoder.layer.0.attention.output.dense.weight",
    "encoder.layer.0.intermediate.dense.weight",
    "pooler.dense.weight",
]  # fmt: skip


def test_attention_value_projections_are_not_heads() -> None:
    assert head_prefixes(BERT_KEYS) == []
    assert head_prefixes([*BERT_KEYS, "value_head.weight", "critic.0.bias"]) == [
        "value_head", "critic"]  # fmt: skip
    # a query/key/value trio outside a module named attention is still an attention
    assert head_prefixes(["mixer.query.weight", "mixer.key.weight", "mixer.value.weight"]) == []
    assert head_prefixes(["model.layers.0.self_attn.v_proj.weight", "v_head.summary.weight"]) == [
        "v_head"]  # fmt: skip
    sb3 = ["mlp_extractor.policy_net.0.weight", "mlp_extractor.value_net.0.weight",
           "action_net.weight", "value_net.weight"]  # fmt: skip
    assert head_prefixes(sb3) == ["mlp_extractor.value_net", "value_net"]


def test_init_on_a_bert_directory_proposes_no_head(tmp_path: Path) -> None:
    import transformers

    model_dir = tmp_path / "bert"
    transformers.BertModel(transformers.BertConfig(
        vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=32)).save_pretrained(model_dir)  # fmt: skip
    written = write_config(model_dir, out=tmp_path / "gate.yaml", name="bert")
    data = yaml.safe_load(written.path.read_text(encoding="utf-8"))
    assert data["causal_lm"]["training_only_heads"] == []
