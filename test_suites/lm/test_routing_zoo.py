"""Fault zoo of ``routing_agreement`` on a tiny Qwen2-MoE built here (:mod:`routing_zoo`):
each fault of a served copy fails with its named kind, each clean twin (an fp32 copy, a
declared bf16 copy) passes; a dump's ``routed_experts`` is audited; a dense model skips; bad
input is named. The clean MoE also loads and compares without a false alarm where transformers
fuses its per-expert tensors (``weights_load``, the precision subject's checkpoint coverage)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from routing_zoo import VARIANTS, Variant, base_config, write_routing_dump

from paritygate.errors import InputError
from paritygate.gate import Gate
from paritygate.load import config_from_dict

pytest.importorskip("transformers")


@pytest.fixture(scope="session")
def moe_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The clean tiny MoE (tokenizer trained on the demo corpus), built once per session."""
    from moe_models import build_moe

    from paritygate.demo.causal_lm import CORPUS, _train_tokenizer

    root = tmp_path_factory.mktemp("moe")
    lines = [ln.strip() for ln in CORPUS.read_text(encoding="utf-8").splitlines() if ln.strip()]
    _train_tokenizer(lines).save_pretrained(root / "tokenizer")
    return build_moe(root / "tokenizer", root / "model")


def _gate(cfg: dict[str, Any], out: Path) -> Gate:
    return Gate(config_from_dict(cfg, out / "gate.yaml"))


def _variant_gate(model: Path, out: Path, variant: Variant) -> Gate:
    cfg = base_config(model)
    variant.build(cfg, model, out)
    return _gate(cfg, out)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_routing_variant(moe_model: Path, tmp_path: Path, variant: Variant) -> None:
    result = _variant_gate(moe_model, tmp_path, variant).evaluate("routing_agreement",
                                                                  golden=False)
    if variant.kind is None:
        assert result.status == "pass", result.message
        assert result.metrics["n_tokens"] > 100
    else:
        assert result.status == "fail", result.message
        assert variant.kind in result.finding_kinds(), result.message


def test_perturbed_router_is_the_root_of_the_logprob_failures(moe_model: Path,
                                                                tmp_path: Path) -> None:
    from paritygate.rootcause import explain

    gate = _variant_gate(moe_model, tmp_path, next(v for v in VARIANTS
                                                   if v.name == "router_perturbed"))
    results = [gate.evaluate(c, golden=False)
               for c in ("weights_load", "logits_agreement", "logprob_delta",
                         "routing_agreement")]
    assert results[2].status == "fail", results[2].message
    _, root = explain(results)
    assert root is not None
    assert (root.check, root.kind) == ("routing_agreement", "router_weights_differ")
    assert {"logprob_delta", "weights_load"} <= set(root.explains)


def test_clean_moe_loads_without_false_alarm(moe_model: Path, tmp_path: Path) -> None:
    """transformers >= 5 fuses experts.<i>.* into experts.gate_up_proj on load: the coverage
    of the loaded model by its file (precision_per_layer's refusal) names nothing, and
    weights_load passes on the fp32 and the declared bf16 copies."""
    import torch
    from transformers import AutoModelForCausalLM

    from paritygate.engines.hf_loading import safetensors_files
    from paritygate.precision.hf import checkpoint_coverage

    model, info = AutoModelForCausalLM.from_pretrained(moe_model, dtype=torch.float32,
                                                       output_loading_info=True)
    coverage = checkpoint_coverage(model, safetensors_files(moe_model), info)
    assert coverage.refusal() is None, coverage.refusal()
    assert not coverage.differ
    for name in ("clean_copy", "bf16_declared"):
        out = tmp_path / name
        out.mkdir()
        gate = _variant_gate(moe_model, out, next(v for v in VARIANTS if v.name == name))
        result = gate.evaluate("weights_load", golden=False)
        assert result.status == "pass", (name, result.message)


def test_dump_routing_audited(moe_model: Path, tmp_path: Path) -> None:
    clean = write_routing_dump(moe_model, tmp_path / "clean.jsonl")
    moved = write_routing_dump(moe_model, tmp_path / "moved.jsonl", router_noise=0.5)
    for dump, kind in ((clean, None), (moved, "dump_routing_differs")):
        cfg = base_config(moe_model, engines=["dump"], engine={"dump": str(dump)},
                          routing={"dump_experts": True})
        result = _gate(cfg, tmp_path).evaluate("routing_agreement", golden=False)
        if kind is None:
            assert result.status == "pass", result.message
            assert result.metrics["dump_n_tokens"] > 20
        else:
            assert result.status == "fail", result.message
            assert kind in result.finding_kinds(), result.message


def test_dump_audit_streams_in_batches(moe_model: Path, tmp_path: Path) -> None:
    """The dump's routing audited one record at a time equals one pass over all records."""
    import torch
    from transformers import AutoModelForCausalLM

    from paritygate.engines.dump_audit import summarise_dump
    from paritygate.engines.hf_routing import moe_layout
    from paritygate.metrics.routed_dump import dump_layers
    from paritygate.result import Measurement

    dump = summarise_dump(write_routing_dump(moe_model, tmp_path / "d.jsonl", router_noise=0.5))
    assert dump.routed.records == 4
    model = AutoModelForCausalLM.from_pretrained(moe_model, dtype=torch.float32).eval()
    layout = moe_layout(model)
    assert layout is not None
    runs = [dump_layers(Measurement("routing_agreement"), dump, model, layout, 1e-4, pad_id=0,
                        batch=b) for b in (1, None)]
    one, whole = runs
    assert one is not None and whole is not None
    for a, b in zip(one, whole, strict=True):
        assert a.n_tokens == b.n_tokens > 20
        assert a.flip_frac == pytest.approx(b.flip_frac)
        assert a.flip_beyond_tie_frac == pytest.approx(b.flip_beyond_tie_frac)
        assert a.margin_min_rel == pytest.approx(b.margin_min_rel)
        assert a.load_training == pytest.approx(b.load_training)
        assert a.load_serving == pytest.approx(b.load_serving)
    assert max(r.flip_frac for r in whole) > 0  # the moved router shows in the merged audit


def test_dump_bad_input_names_the_field(moe_model: Path, tmp_path: Path) -> None:
    dropped = write_routing_dump(moe_model, tmp_path / "dropped.jsonl", drop=True)
    cfg = base_config(moe_model, engines=["dump"], engine={"dump": str(dropped)},
                      routing={"dump_experts": True})
    with pytest.raises(InputError, match="line 2: routed_experts: required field missing"):
        _gate(cfg, tmp_path).evaluate("routing_agreement", golden=False)
    bad = write_routing_dump(moe_model, tmp_path / "bad.jsonl", bad_id=True)
    cfg = base_config(moe_model, engines=["dump"], engine={"dump": str(bad)})
    with pytest.raises(InputError, match=r"line 1: routed_experts\[0\].*out of range"):
        _gate(cfg, tmp_path).evaluate("routing_agreement", golden=False)


def test_dense_model_skips_or_is_bad_input_when_routing_is_asked(tmp_path: Path) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from paritygate.demo.causal_lm import CORPUS, _train_tokenizer

    lines = [ln.strip() for ln in CORPUS.read_text(encoding="utf-8").splitlines() if ln.strip()]
    tok_dir = tmp_path / "dense"
    _train_tokenizer(lines[:50]).save_pretrained(tok_dir)
    tok = AutoTokenizer.from_pretrained(tok_dir)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                 num_hidden_layers=1, num_attention_heads=1,
                                 num_key_value_heads=1)).save_pretrained(tok_dir)
    cfg = base_config(tok_dir)
    cfg["causal_lm"].pop("routing")
    result = _gate(cfg, tmp_path).evaluate("routing_agreement", golden=False)
    assert result.status == "skip" and "dense model" in result.message
    with pytest.raises(InputError, match=r"causal_lm\.routing"):
        _gate(base_config(tok_dir), tmp_path).evaluate("routing_agreement", golden=False)
