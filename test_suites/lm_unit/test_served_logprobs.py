"""logits_agreement's vLLM measurement with vLLM-shaped fakes: prompt log-probs over the whole
vocabulary at each generated position, put in the trainer's gauge, equal the trainer's logits
when the served model is the trainer's, and a served copy that differs shows by as much."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from paritygate.engines import vllm_sampling
from paritygate.engines.generation import Generation
from paritygate.engines.vllm_engine import VLLMEngine
from paritygate.families.causal_lm.served_logprobs import vllm_rows

V = 7


def _log_softmax(z: np.ndarray) -> np.ndarray:
    top = z.max(-1, keepdims=True)
    return z - top - np.log(np.exp(z - top).sum(-1, keepdims=True))


@dataclass
class _FakeLLM:
    """Serves ``logits(sequence prefix)``: prompt log-probs at every position but the first."""

    shift: float = 0.0

    def logits(self, prefix: list[int]) -> np.ndarray:
        return np.sin(np.arange(V) * (1 + sum(prefix) % 5)) * 3 + self.shift * np.arange(V)

    def generate(self, requests: list[dict[str, Any]], params: Any, **_: Any) -> list[Any]:
        assert params["prompt_logprobs"] == -1 and params["max_tokens"] == 1
        out = []
        for request in requests:
            ids = request["prompt_token_ids"]
            steps: list[Any] = [None]
            for t in range(1, len(ids)):
                lp = _log_softmax(self.logits(ids[:t]))
                steps.append({k: SimpleNamespace(logprob=float(lp[k])) for k in range(V)})
            out.append(SimpleNamespace(prompt_logprobs=steps))
        return out


class _Ctx:
    def __init__(self, llm: _FakeLLM, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(vllm_sampling, "_import_vllm",
                            lambda: SimpleNamespace(SamplingParams=lambda **kw: kw))
        self._engine = VLLMEngine("/m")
        self._engine._llm = llm
        self.trainer = _FakeLLM()
        self.probes = [SimpleNamespace(id="a"), SimpleNamespace(id="b")]
        self.gen = Generation([[1, 2], [3]], [[4, 5, 6], []], [[], []], None, "raw", "vllm")

    def greedy(self, engine: str) -> Generation:
        return self.gen

    def engine(self, name: str) -> VLLMEngine:
        return self._engine

    def teacher_forced(self, gen: Generation) -> list[np.ndarray]:
        rows = []
        for prompt, output in zip(gen.prompt_ids, gen.output_ids, strict=True):
            seq = prompt + output
            rows.append(np.stack([self.trainer.logits(seq[: len(prompt) + j])
                                  for j in range(len(output) + 1)]))
        return rows


def _rows(ctx: _Ctx) -> Any:
    """What ``Generations.vllm_served_rows`` passes."""
    return vllm_rows(ctx.greedy("vllm"), ctx.teacher_forced, ctx.engine("vllm"),
                     [p.id for p in ctx.probes])


def test_same_model_gives_the_trainers_logits(monkeypatch: pytest.MonkeyPatch) -> None:
    found = _rows(_Ctx(_FakeLLM(), monkeypatch))
    assert not isinstance(found, str)
    reference, candidate, owners = found
    assert reference.shape == candidate.shape == (3, V)
    assert owners == ["a@0", "a@1", "a@2"]
    np.testing.assert_allclose(candidate, reference, atol=1e-5)


def test_a_different_served_model_shows(monkeypatch: pytest.MonkeyPatch) -> None:
    found = _rows(_Ctx(_FakeLLM(shift=0.05), monkeypatch))
    assert not isinstance(found, str)
    reference, candidate, _ = found
    assert np.abs(candidate - reference).max() > 0.05
