"""Causal-LM inputs: bad files raise InputError naming file and key; formats parse with
their own defaults; the demo LM is peaked and round-trips through from_pretrained."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from lm_zoo import CONFIG, clean_config

from paritygate.check import Thresholds
from paritygate.engines.generation import SamplingSpec
from paritygate.errors import InputError
from paritygate.families.causal_lm.build import build_lm_context
from paritygate.families.causal_lm.probes import load_probes
from paritygate.families.causal_lm.sampling import load_sampling_file
from paritygate.load import config_from_dict, load_config


def test_committed_config_validates() -> None:
    config = load_config(CONFIG)
    assert config.family == "causal_lm"
    assert config.causal_lm is not None
    assert config.causal_lm.tier() == "fp32/fp32"


def test_committed_probes_cover_edge_cases() -> None:
    probes = {p.id: p for p in load_probes(CONFIG.parent / "../golden/demo-lm/probes.jsonl")}
    assert probes["empty"].text == ""
    assert any(p.is_chat and len(p.messages or ()) >= 3 for p in probes.values())
    assert any("</s>" in (p.text or "") for p in probes.values())
    assert any(any(ord(c) > 127 for c in (p.text or "")) for p in probes.values())


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ('{"id": "a"}', "line 1"),
        ('{"id": "a", "text": 3}', "line 1.text"),
        ('{"id": "a", "messages": [{"role": "user"}]}', "line 1.messages[0]"),
        ("not json", "line 1"),
        ('{"id": "a", "text": "x", "colour": 1}', "line 1.colour"),
    ],
)
def test_bad_probes_name_line_and_key(tmp_path: Path, line: str, key: str) -> None:
    path = tmp_path / "probes.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(InputError) as err:
        load_probes(path)
    assert err.value.key == key
    assert err.value.file == str(path)


def test_missing_model_dir_names_key(tmp_path: Path, demo_lm: Path) -> None:
    data = clean_config(demo_lm)
    data["causal_lm"]["model_dir"] = str(tmp_path / "nowhere")
    with pytest.raises(InputError) as err:
        build_lm_context(config_from_dict(data, tmp_path / "gate.yaml"))
    assert err.value.key == "causal_lm.model_dir"


def test_missing_serving_model_dir_names_its_key(tmp_path: Path, demo_lm: Path) -> None:
    data = clean_config(demo_lm)  # the serving sampling config left to the serving dir
    data["causal_lm"]["sampling"].pop("serving")
    data["causal_lm"]["tokenizer"].pop("serving")
    data["causal_lm"]["serving"] = {"model_dir": str(tmp_path / "nowhere")}
    with pytest.raises(InputError) as err:
        build_lm_context(config_from_dict(data, tmp_path / "gate.yaml"))
    assert err.value.key == "causal_lm.serving.model_dir"
    assert "serving model directory not found" in err.value.cause


def test_bad_logprob_fn_names_key(tmp_path: Path, demo_lm: Path) -> None:
    data = clean_config(demo_lm)
    data["causal_lm"]["training"]["logprob_fn"] = "paritygate.families.causal_lm.logprobs:nope"
    with pytest.raises(InputError) as err:
        build_lm_context(config_from_dict(data, tmp_path / "gate.yaml"))
    assert err.value.key == "causal_lm.training.logprob_fn"


def test_unknown_sampling_field_names_key(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("temperature: 1.0\ntemprature: 0.5\n")
    with pytest.raises(InputError) as err:
        load_sampling_file(path, trainer=True, side_defaults={})
    assert err.value.key == "temprature"


def test_generation_config_takes_hf_defaults(tmp_path: Path) -> None:
    path = tmp_path / "generation_config.json"
    path.write_text(json.dumps({"do_sample": True, "eos_token_id": 2}))
    loaded = load_sampling_file(path, trainer=False, side_defaults={})
    assert loaded.values["top_k"] == 50 and loaded.values["max_new_tokens"] == 20
    assert loaded.format == "hf_generation_config" and "HF fields" in loaded.detection


def test_generation_config_typo_names_field(tmp_path: Path) -> None:
    path = tmp_path / "generation_config.json"
    path.write_text(json.dumps({"transformers_version": "4.50", "temprature": 0.7}))
    with pytest.raises(InputError) as err:
        load_sampling_file(path, trainer=False, side_defaults={})
    assert err.value.key == "temprature" and "temperature" in err.value.cause


def test_trainer_json_is_not_read_as_generation_config(tmp_path: Path) -> None:
    path = tmp_path / "trainer.json"
    path.write_text(json.dumps({"temperature": 0.9, "max_new_tokens": 64}))
    loaded = load_sampling_file(path, trainer=True, side_defaults={})
    assert loaded.format == "trainer" and loaded.values["do_sample"] is True
    assert loaded.values["top_k"] == 0
    forced = load_sampling_file(path, trainer=True, side_defaults={}, fmt="hf_generation_config")
    assert forced.detection == "configured" and forced.values["top_k"] == 50


def test_hf_only_fields_listed_as_not_compared(tmp_path: Path) -> None:
    path = tmp_path / "generation_config.json"
    path.write_text(json.dumps({"do_sample": True, "typical_p": 0.9, "min_p": 0.1}))
    loaded = load_sampling_file(path, trainer=False, side_defaults={})
    assert loaded.not_compared == {"typical_p": 0.9} and loaded.values["min_p"] == 0.1


def test_sampling_spec_from_vllm_names() -> None:
    spec = SamplingSpec.from_dict({"max_tokens": 8, "top_k": -1, "stop": "\n", "temperature": 0})
    assert (spec.max_new_tokens, spec.top_k, spec.stop, spec.do_sample) == (8, 0, ["\n"], False)
    with pytest.raises(KeyError):
        SamplingSpec.from_dict({"temprature": 1.0})


def test_demo_is_peaked_and_carries_value_head(demo_lm: Path) -> None:
    from safetensors import safe_open

    from paritygate.demo.causal_lm import mean_entropy
    from paritygate.engines.hf_loading import load_causal_lm
    from paritygate.families.causal_lm.tokenizer import load_tokenizer

    with safe_open(str(demo_lm / "model.safetensors"), "pt") as fh:
        keys = set(fh.keys())
    assert {"v_head.summary.weight", "v_head.summary.bias"} <= keys
    assert (demo_lm / "generation_config.json").is_file()
    model, info = load_causal_lm(demo_lm)
    assert set(info["unexpected_keys"]) == {"v_head.summary.weight", "v_head.summary.bias"}
    tok = load_tokenizer(demo_lm)
    import torch

    text = (Path(__file__).resolve().parents[2] / "src/paritygate/demo/data/corpus.txt").read_text()
    ids = torch.tensor([tok(text[:2000])["input_ids"][:64]])
    assert mean_entropy(model, ids) < 0.5 * math.log(len(tok))


def test_precision_subject_runs(lm_variants) -> None:
    import torch

    subject = lm_variants.gate("clean").context.precision_subject()
    model = subject.build_model()
    args, kwargs = subject.batches[0]
    with torch.inference_mode():
        logits = subject.select_output(model(*args, **kwargs))
    assert logits.shape[:2] == kwargs["input_ids"].shape
    assert not model.training


def test_vllm_delta_wiring_with_stand_in_engine(lm_variants, monkeypatch) -> None:
    """vllm_delta runs the shared delta measurement on whatever engine is named vllm;
    here the HF engine stands in for vLLM so the path is exercised without a GPU."""
    import paritygate.checks.vllm_delta as vllm_delta
    from paritygate.engines.hf_generate import HFGenerateEngine

    ctx = lm_variants.gate("clean").context
    hf = ctx.engines["hf"]
    stand_in = HFGenerateEngine(
        hf.model,
        pad_token_id=hf.pad_token_id,
        eos_token_id=hf.eos_token_id,
        tokenizer=hf.tokenizer,
    )
    stand_in.name = "vllm"
    monkeypatch.setitem(ctx.engines.__dict__, "vllm", stand_in)  # its cached_property
    monkeypatch.setattr(vllm_delta, "unavailable_reason", lambda model_dir=None: None)
    m = vllm_delta.CHECK.measures["causal_lm"](ctx, Thresholds(vllm_delta.CHECK.defaults))
    assert m.skipped is None and not m.findings, m.findings
    assert m.details["engine"]["name"] == "vllm"
    assert m.metrics["n_tokens"].value > 0


def test_precision_subject_streamed_gives_the_loaded_numbers(lm_variants) -> None:
    """precision.streaming: true on the causal-LM family (training-only v_head in the file)."""
    import dataclasses

    from paritygate.precision.analysis import run_precision
    from paritygate.precision.config import PrecisionSpec

    clean = lm_variants.gate("clean").context
    spec = PrecisionSpec(suggest_mixed=False, max_batches=1, streaming=False)

    def with_precision(p: PrecisionSpec) -> object:  # the config is frozen: a copy per setting
        return dataclasses.replace(clean, config=clean.config.model_copy(update={"precision": p}))

    whole = run_precision(with_precision(spec).precision_subject(), spec, 16, 8)
    subject = with_precision(spec.model_copy(update={"streaming": True})).precision_subject()
    assert subject.refusal is None
    streamed = run_precision(subject, spec, 16, 8)
    assert any("streamed layer by layer" in n for n in streamed.notes)
    assert [r.layer for r in whole.rows] == [r.layer for r in streamed.rows]
    for a, b in zip(whole.rows, streamed.rows, strict=True):
        assert a.local_rel_l2 == pytest.approx(b.local_rel_l2, rel=1e-5, abs=1e-12)
        assert a.cum_rel_l2 == pytest.approx(b.cum_rel_l2, rel=1e-5, abs=1e-12)
