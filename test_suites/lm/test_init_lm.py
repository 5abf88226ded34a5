"""``paritygate init`` on an HF model directory: inspect, fill the TODOs, bless, run."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
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
    assert written.todos == ["causal_lm.serving.model_dir", "causal_lm.sampling.training",
                             "causal_lm.probes", "causal_lm.training.logprob_fn",
                             *_reference_todos(demo_lm)]
    data = yaml.safe_load(written.path.read_text(encoding="utf-8"))
    section = data["causal_lm"]
    assert section["training_only_heads"] == ["v_head."]
    # no serving path init cannot know: the served directory's own files are the defaults
    assert "serving" not in section["sampling"] and "serving" not in section["tokenizer"]
    assert "dtype" not in section["engine"]
    assert section["tokenizer"]["training"] == section["model_dir"]
    with pytest.raises(InputError) as refused:
        Gate.from_path(written.path)
    assert refused.value.key == "causal_lm.serving.model_dir"
    assert "still TODO" in refused.value.cause

    _fill_lm_todos(written.path, serving=section["model_dir"])
    for bless in (True, False):
        gate = Gate.from_path(written.path, update_golden=bless)
        results = [gate.evaluate(c.id) for c in gate.checks() if "gpu" not in c.marks]
        assert results and all(r.status in ("pass", "skip") for r in results), [
            (r.id, r.status, r.message) for r in results if r.status not in ("pass", "skip")]
    assert (tmp_path / "golden" / "lm-init" / "logprob_delta.json").is_file()


def _reference_todos(model_dir: Path) -> list[str]:
    """The KL reference's TODOs init leaves when it finds a ``reference`` directory beside the
    checkpoint (the demo builds one for its RL-loop gate)."""
    if not (model_dir.parent / "reference").is_dir():
        return []
    return ["causal_lm.reference.initial", "causal_lm.reference.kl_estimator"]


def _fill_lm_todos(path: Path, serving: str | None) -> None:
    """Fill the TODOs init leaves in an LM config: the trainer's sampling YAML and the probes
    (copied beside the config), the reference log-prob function, the KL reference's initial
    policy and estimator (when init found a reference) and, when given, the served
    directory."""
    shutil.copy(REPO / "configs" / "sampling" / "demo-lm-train.yaml", path.parent / "trainer.yaml")
    shutil.copy(REPO / "golden" / "demo-lm" / "probes.jsonl", path.parent / "probes.jsonl")
    text = path.read_text(encoding="utf-8")
    values = {
        "training": "trainer.yaml",
        "probes": "probes.jsonl",
        "logprob_fn": "paritygate.families.causal_lm.logprobs:compute_logprobs",
    }
    if serving is not None:
        values["model_dir"] = serving
    for key, value in values.items():
        text, n = re.subn(rf'({key}: )"TODO(?:[^"\\]|\\.)*"', rf"\g<1>{value}", text, count=1)
        assert n == 1, key
    data = yaml.safe_load(text)
    reference = data["causal_lm"].get("reference")
    if reference is not None:  # the demo's initial policy sits beside its KL reference
        initial = (path.parent / reference["model_dir"]).resolve().parent / "initial"
        for key, value in (("initial", str(initial)), ("kl_estimator", "k3")):
            text, n = re.subn(rf'({key}: )"TODO(?:[^"\\]|\\.)*"', rf"\g<1>{value}", text,
                              count=1)
            assert n == 1, key
    path.write_text(text, encoding="utf-8")


def test_init_with_the_served_copy_catches_its_own_sampling(
    demo_lm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """init on the training directory and the served copy (--serving): the config names only
    serving.model_dir, so the copy's own generation_config.json (temperature 0.7) is what
    sampling_config compares; the same copy at the trainer's temperature passes."""
    from lm_zoo import _saved_copy

    monkeypatch.chdir(tmp_path)
    for temperature, status in ((0.7, "fail"), (None, "pass")):
        out = tmp_path / ("hot" if temperature else "same")
        out.mkdir()
        served = _saved_copy(demo_lm, out, temperature=temperature)
        written = write_config(demo_lm, out=out / "configs" / "lm.yaml", name="lm-served",
                               serving=served)
        assert "causal_lm.serving.model_dir" not in written.todos
        section = yaml.safe_load(written.path.read_text(encoding="utf-8"))["causal_lm"]
        assert section["serving"]["model_dir"] == "../served-float32"
        assert "serving" not in section["sampling"] and "dtype" not in section["engine"]
        _fill_lm_todos(written.path, serving=None)
        result = Gate.from_path(written.path).evaluate("sampling_config", golden=False)
        assert result.status == status, result.message
        if temperature:
            assert [r.finding for r in result.reasons if r.kind == "finding"] == ["field_differs"]
            assert ("temperature differs: training 1.0 vs serving 0.7 (trainer.yaml vs "
                    "generation_config.json)") in result.message


def test_init_on_a_bf16_served_copy_is_self_consistent(
    demo_lm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """init with a bfloat16 served copy (config.json dtype bfloat16) writes no dtype pair that
    contradicts itself: no engine.dtype, the training dtype from the training directory; the
    config runs and every check passes, judged by the bf16/fp32 tier; declaring
    serving.dtype: bfloat16 on top is consistent too."""
    from lm_zoo import _saved_copy

    monkeypatch.chdir(tmp_path)
    served = _saved_copy(demo_lm, tmp_path, dtype="bfloat16")
    written = write_config(demo_lm, out=Path("configs/lm.yaml"), name="lm-bf16", serving=served)
    text = written.path.read_text(encoding="utf-8")
    section = yaml.safe_load(text)["causal_lm"]
    assert section["training"]["dtype"] == "float32" and "dtype" not in section["engine"]
    assert "dtype: default: the served config.json's dtype (bfloat16)" in text
    _fill_lm_todos(written.path, serving=None)
    for declare in (False, True):
        if declare:
            text = written.path.read_text(encoding="utf-8").replace(
                "    model_dir: ../served-bfloat16", "    model_dir: ../served-bfloat16\n"
                "    dtype: bfloat16")
            written.path.write_text(text, encoding="utf-8")
        gate = Gate.from_path(written.path)
        results = [gate.evaluate(c.id, golden=False) for c in gate.checks()
                   if "gpu" not in c.marks]
        assert all(r.status in ("pass", "skip") for r in results), [
            (r.id, r.message) for r in results if r.status not in ("pass", "skip")]
        generation = next(r for r in results if r.id == "generation_parity")
        assert "near_tie_margin 0.354 (bf16/fp32 tier; default 0.001 for fp32)" in " ".join(
            generation.details["notes"])


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


def test_init_on_a_bert_directory_writes_an_hf_model_gate_that_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An encoder is no causal LM: init writes the hf_model (precision) config, which runs once
    its probes are named; no sampling or log-prob TODOs, no heads proposed from its
    attention value projections."""
    import transformers

    monkeypatch.chdir(tmp_path)
    model_dir = tmp_path / "bert"
    transformers.BertModel(transformers.BertConfig(
        vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=32)).save_pretrained(model_dir)  # fmt: skip
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cart", "pole", "moves", "left"]
    (model_dir / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    transformers.BertTokenizer(str(model_dir / "vocab.txt")).save_pretrained(model_dir)
    written = write_config(model_dir, out=Path("configs/bert.yaml"), name="bert")
    assert written.notes[1] == "family hf_model: BertModel is not a causal LM"
    assert written.todos == ["hf_model.probes"]
    data = yaml.safe_load(written.path.read_text(encoding="utf-8"))
    assert data["family"] == "hf_model" and "causal_lm" not in data
    assert data["hf_model"]["model_dir"] == "../bert" and data["hf_model"]["tokenizer"] is None
    Path("configs/probes.txt").write_text("the cart moves left\nthe pole\n", encoding="utf-8")
    text = written.path.read_text(encoding="utf-8")
    text, n = re.subn(r'(probes: )"TODO(?:[^"\\]|\\.)*"', r"\g<1>probes.txt", text, count=1)
    assert n == 1
    written.path.write_text(text, encoding="utf-8")
    for bless in (True, False):
        gate = Gate.from_path(written.path, update_golden=bless)
        results = [gate.evaluate(c.id) for c in gate.checks()]
        assert {r.id for r in results} == {"weights_load", "precision_per_layer"}
        assert all(r.status == "pass" for r in results), [(r.id, r.message) for r in results]


def test_init_refuses_an_hf_directory_no_family_can_feed(tmp_path: Path) -> None:
    """A vision model takes pixels and an encoder-decoder a decoder input: init says why it
    writes no config and which route gates it, naming config.json's key."""
    from safetensors.numpy import save_file

    for arch, extra, key, cause in (
        ("ViTModel", {}, "architectures", "ViTModel takes pixel_values"),
        ("T5ForConditionalGeneration", {"is_encoder_decoder": True}, "is_encoder_decoder",
         "is an encoder-decoder"),
    ):
        model_dir = tmp_path / arch
        model_dir.mkdir()
        (model_dir / "config.json").write_text(
            json.dumps({"architectures": [arch], "model_type": "x", **extra}), encoding="utf-8")
        save_file({"w": np.zeros(2, dtype=np.float32)}, str(model_dir / "model.safetensors"))
        with pytest.raises(InputError) as refused:
            write_config(model_dir, out=tmp_path / f"{arch}.yaml")
        assert (refused.value.file, refused.value.key) == (str(model_dir / "config.json"), key)
        assert cause in refused.value.cause and "family: policy" in refused.value.cause
        assert not (tmp_path / f"{arch}.yaml").exists()
