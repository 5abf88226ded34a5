"""Seeded vLLM requests submitted in waves that vLLM prefills whole.

vLLM seeds a request's own ``torch.Generator`` (``SamplingParams(seed=)``). When the
scheduler prefills a request in pieces (chunked prefill: the step's token budget ran out, or a
preempted request recomputed), the model runner drops the token sampled after a partial
piece and rewinds that generator with ``set_offset(get_offset() - 4)``. A CPU generator has
no offset: on vLLM's CPU build this raises "CPU Generator does not use offset" in the engine
core, and every later request fails with ``EngineDeadError``. So seeded requests go to vLLM in
waves that fit one scheduler step (their prompt tokens within ``max_num_batched_tokens``,
their number within ``max_num_seqs``) and the KV cache (prompt plus ``max_tokens``, whole
blocks): every prompt is prefilled in one piece and no request is preempted, so no generator
is rewound, and a request's draw depends on its seed alone, as on a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class WaveLimits:
    """What one wave of requests may hold: tokens prefilled in one scheduler step, running
    requests, and KV-cache blocks (``None``: unknown, not limited)."""

    step_tokens: int | None = None
    requests: int | None = None
    kv_blocks: int | None = None
    block_size: int = 16

    @classmethod
    def of(cls, llm: Any) -> WaveLimits:
        """The limits of a started ``vllm.LLM`` (read from its engine config; an object
        without one, such as a test double, is not limited)."""
        config = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
        scheduler = getattr(config, "scheduler_config", None)
        cache = getattr(config, "cache_config", None)
        return cls(
            step_tokens=getattr(scheduler, "max_num_batched_tokens", None),
            requests=getattr(scheduler, "max_num_seqs", None),
            kv_blocks=getattr(cache, "num_gpu_blocks", None) or None,
            block_size=int(getattr(cache, "block_size", None) or 16),
        )


def request_waves(prompt_lengths: Sequence[int], max_tokens: Sequence[int],
                  limits: WaveLimits) -> list[range]:
    """Consecutive request indices grouped in waves within ``limits`` (a request that alone
    exceeds a limit gets a wave of its own; vLLM splits or refuses it as it would anyway)."""
    waves: list[range] = []
    start, tokens, blocks = 0, 0, 0
    for i, (length, new) in enumerate(zip(prompt_lengths, max_tokens, strict=True)):
        need = -(-(int(length) + int(new)) // limits.block_size)
        full = i > start and (
            (limits.step_tokens is not None and tokens + length > limits.step_tokens)
            or (limits.requests is not None and i - start >= limits.requests)
            or (limits.kv_blocks is not None and blocks + need > limits.kv_blocks))
        if full:
            waves.append(range(start, i))
            start, tokens, blocks = i, 0, 0
        tokens += int(length)
        blocks += need
    if start < len(prompt_lengths):
        waves.append(range(start, len(prompt_lengths)))
    return waves


def generate_in_waves(llm: Any, requests: Sequence[dict[str, list[int]]], params: Sequence[Any],
                      max_tokens: int, **extra: Any) -> list[Any]:
    """``llm.generate`` over ``requests`` (each ``{"prompt_token_ids": [...]}``) with their
    ``params`` (each generating up to ``max_tokens``), wave by wave (:func:`request_waves`):
    the outputs in request order."""
    lengths = [len(r["prompt_token_ids"]) for r in requests]
    outputs: list[Any] = []
    for wave in request_waves(lengths, [max_tokens] * len(requests), WaveLimits.of(llm)):
        outputs += llm.generate([requests[i] for i in wave], [params[i] for i in wave],
                                use_tqdm=False, **extra)
    return outputs
