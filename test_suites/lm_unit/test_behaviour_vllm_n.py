"""behaviour_parity's vLLM side with vLLM-shaped fakes: one seeded request per sample (seeds
from the spec's seed, the prompt and the sample index), the stop reason read from vLLM's
``finish_reason`` / ``stop_reason`` (vLLM leaves a stop string out of the text, so it cannot
be found in the tokens)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from paritygate.engines import vllm_sampling
from paritygate.engines.dump_stream import finish_from_vllm
from paritygate.engines.generation import SamplingSpec
from paritygate.engines.vllm_engine import VLLMEngine
from paritygate.engines.vllm_sampling import sample_n


@dataclass
class _Completion:
    token_ids: list[int]
    finish_reason: str
    stop_reason: int | str | None = None


@dataclass
class _Request:
    outputs: list[_Completion]


@dataclass
class _FakeLLM:
    calls: list[tuple[list[Any], list[dict[str, Any]]]] = field(default_factory=list)

    def generate(self, requests: list[Any], params: list[dict[str, Any]], **_: Any) -> list[Any]:
        self.calls.append((requests, params))
        ends = [("length", None), ("stop", "\n"), ("stop", None)]
        return [_Request([_Completion([7, i, k], *ends[k % 3]) for k in range(p["n"])])
                for i, p in enumerate(params)]


def test_one_seeded_request_per_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_sampling, "_import_vllm",
                        lambda: SimpleNamespace(SamplingParams=lambda **kw: kw))
    engine = VLLMEngine("/m")
    fake = _FakeLLM()
    engine._llm = fake
    gen, reasons = sample_n(engine, [[1, 2], [3]], SamplingSpec(temperature=0.8, seed=5), 4)
    requests, params = fake.calls[0]
    assert len(fake.calls) == 1 and len(requests) == 8
    assert [p["n"] for p in params] == [1] * 8 and params[0]["temperature"] == 0.8
    seeds = [p["seed"] for p in params]
    assert len(set(seeds)) == 8 and params[0]["logprobs"] is None
    assert seeds == [vllm_sampling.sample_seed(5, i, k) for i in range(2) for k in range(4)]
    assert gen.prompt_ids == [[1, 2]] * 4 + [[3]] * 4
    assert reasons[:2] == ["length", "length"]


def test_sample_seeds_follow_the_seed() -> None:
    seeds = {vllm_sampling.sample_seed(s, 0, 0) for s in range(20)}
    assert len(seeds) == 20
    assert vllm_sampling.sample_seed(3, 1, 2) == vllm_sampling.sample_seed(3, 1, 2)
    assert vllm_sampling.sample_seed(None, 1, 2) is None


def test_finish_reason_mapping() -> None:
    assert finish_from_vllm("length", None) == "length"
    assert finish_from_vllm("stop", "###") == "stop"
    assert finish_from_vllm("stop", 2) == "eos"
    assert finish_from_vllm("stop", None) == "eos"


def test_seeded_requests_go_in_waves_vllm_prefills_whole() -> None:
    """vLLM's CPU build cannot rewind a seeded request's generator after a partial prefill (its
    engine dies): waves keep every prompt within one step's token budget, the running-request
    limit and the KV cache (prompt plus max_tokens, whole blocks)."""
    from paritygate.engines.vllm_waves import WaveLimits, request_waves

    limits = WaveLimits(step_tokens=100, requests=3, kv_blocks=20, block_size=16)
    waves = request_waves([40] * 7, [16] * 7, limits)
    assert [list(w) for w in waves] == [[0, 1], [2, 3], [4, 5], [6]]  # 2 x 40 <= 100 < 3 x 40
    assert [len(w) for w in request_waves([10] * 7, [16] * 7, limits)] == [3, 3, 1]
    assert [len(w) for w in request_waves([10] * 7, [300] * 7, limits)] == [1] * 7  # KV cache
    assert [list(w) for w in request_waves([500, 5], [1, 1], limits)] == [[0], [1]]
    assert request_waves([40] * 7, [16] * 7, WaveLimits()) == [range(7)]
    assert WaveLimits.of(_FakeLLM()) == WaveLimits()


def test_waves_keep_request_order(monkeypatch: pytest.MonkeyPatch) -> None:
    from paritygate.engines import vllm_waves

    monkeypatch.setattr(vllm_waves.WaveLimits, "of",
                        classmethod(lambda cls, llm: cls(step_tokens=4)))
    monkeypatch.setattr(vllm_sampling, "_import_vllm",
                        lambda: SimpleNamespace(SamplingParams=lambda **kw: kw))
    engine = VLLMEngine("/m")
    fake = _FakeLLM()
    engine._llm = fake
    gen, _ = sample_n(engine, [[1, 2], [3]], SamplingSpec(seed=5), 2)
    assert [len(r) for r, _ in fake.calls] == [2, 2]  # 2 + 2 prompt tokens, then 1 + 1
    assert gen.prompt_ids == [[1, 2], [1, 2], [3], [3]]
