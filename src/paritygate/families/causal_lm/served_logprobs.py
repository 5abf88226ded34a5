"""``logits_agreement`` on vLLM: the served distribution from vLLM's prompt log-probs.

vLLM returns no logits, but with ``prompt_logprobs=-1`` it returns the whole vocabulary's
log-probs at every position of a teacher-forced sequence. On the greedy continuations of the
probes these are the served model's next-token distributions, position by position, as the HF
engine's cached logits are. Log-probs are logits less their row's log-normaliser; the served
rows are put in the trainer's gauge (the trainer's log-normaliser of the row added back), so
the logit metrics and their precision tier read them as they read the HF engine's logits, and
both engines give one verdict on one served copy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from paritygate.engines.generation import Generation
    from paritygate.engines.vllm_engine import VLLMEngine

MAX_ENTRIES = 16_000_000
"""Most (positions x vocabulary) log-probs fetched from vLLM (~64 MB as float32; vLLM builds a
Python object per entry): beyond it the check is skipped saying so."""


def vllm_rows(generation: Generation, teacher_forced: Callable[[Generation], list[np.ndarray]],
              engine: object, probe_ids: Sequence[str]
              ) -> tuple[np.ndarray, np.ndarray, list[str]] | str:
    """``(reference, candidate, owners)``: the trainer's logits (``teacher_forced`` over the
    greedy ``generation``) and vLLM's log-probs in the trainer's gauge, ``(N, V)`` each, over
    the greedy continuation's tokens, with each row's ``probe@position``; or why they cannot be
    measured. ``engine`` is the gate's vLLM engine."""
    kept = [i for i, output in enumerate(generation.output_ids) if output]
    if not kept:
        return "the engine generated no tokens for any probe"
    teacher = teacher_forced(generation)
    vocab = int(teacher[kept[0]].shape[-1])
    positions = sum(len(generation.output_ids[i]) for i in kept)
    if positions * vocab > MAX_ENTRIES:
        return (f"vLLM's prompt log-probs of {positions} positions x {vocab} tokens exceed "
                f"{MAX_ENTRIES} entries: logits_agreement needs the HF engine for this model "
                "(engines: [hf, vllm])")
    from paritygate.engines.vllm_sampling import prompt_logprobs

    served = prompt_logprobs(cast("VLLMEngine", engine), [generation.prompt_ids[i] for i in kept],
                             [generation.output_ids[i] for i in kept], vocab)
    refs, cands, owners = [], [], []
    for i, logp in zip(kept, served, strict=True):
        n = len(generation.output_ids[i])
        ref = np.asarray(teacher[i][:n], dtype=np.float64)  # (n, V)
        top = ref.max(-1, keepdims=True)
        norm = top + np.log(np.exp(ref - top).sum(-1, keepdims=True))  # (n, 1)
        refs.append(ref)
        cands.append(logp.astype(np.float64) + (norm if logp.shape == ref.shape else 0.0))
        owners += [f"{probe_ids[i]}@{j}" for j in range(n)]
    return np.concatenate(refs), np.concatenate(cands), owners
