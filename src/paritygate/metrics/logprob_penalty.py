"""A penalty's signature in a token log-prob delta: served log-probs lowered on repeated tokens.

A repetition, presence or frequency penalty lowers the served logits of tokens already in the
context, so the engine's log-prob of a sampled token that appeared before (in the prompt or
earlier in the completion) is lower than the trainer's (``delta = trainer - engine > 0``),
while a fresh token's is higher, always (the mass the penalty took from the seen tokens is
renormalised onto the others: ``delta < 0`` for every fresh token, by as much as the penalised
tokens held). Precision noise and different weights do not depend on whether a token was seen
before and move fresh tokens both ways; a truncation on one side (min_p, top-k, top-p) raises
every kept token, the repeated ones too. :func:`penalty_signature` splits the delta by that.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

SEPARATION_SIGMAS = 3.0
"""The repeated tokens' mean delta must exceed the fresh tokens' by this many standard errors."""
FRESH_RAISED = 0.9
"""Share of the fresh tokens that moved (beyond the noise floor) whose served log-prob rose: a
penalty raises every one of them; noise and other weights raise about half."""
MIN_TOKENS = 4
"""Tokens each group needs before the split is read."""


@dataclass(frozen=True)
class PenaltySignature:
    """The delta split by "the sampled token appeared before in prompt + completion"."""

    repeated_tokens: int
    fresh_tokens: int
    repeated_mean: float
    """Mean ``trainer - engine`` log-prob over repeated tokens (a penalty makes it > 0)."""
    fresh_mean: float
    separation: float
    """``(repeated_mean - fresh_mean)`` in standard errors of the difference."""
    fresh_raised: float
    """Share of the fresh tokens beyond the noise floor whose served log-prob is the higher."""
    seen_in: str = "prompt or completion"
    """Where a repeated token was seen before: ``prompt or completion`` (a repetition penalty)
    or ``completion`` (vLLM's presence and frequency penalties count the completion only)."""

    @property
    def penalty(self) -> bool:
        """Whether the delta has a penalty's shape: repeated tokens lowered on the served side
        (on average, not only relative to fresh ones: a truncation on one side, such as min_p,
        raises every kept token, repeated or not), significantly more than fresh ones, and
        nearly every fresh token that moved raised."""
        return (self.repeated_tokens >= MIN_TOKENS and self.fresh_tokens >= MIN_TOKENS
                and self.repeated_mean > 0.0 and self.separation >= SEPARATION_SIGMAS
                and self.fresh_raised >= FRESH_RAISED)

    def describe(self) -> str:
        return (f"repeated tokens (seen before in {self.seen_in}) score "
                f"{self.repeated_mean:+.3g} nats trainer minus engine on average over "
                f"{self.repeated_tokens} tokens, fresh tokens {self.fresh_mean:+.3g} over "
                f"{self.fresh_tokens} ({self.separation:.1f} standard errors apart), and "
                f"{self.fresh_raised:.0%} of the fresh tokens that moved score higher on the "
                "engine (the mass a penalty takes from repeated tokens goes to the others)")

    def as_details(self) -> dict[str, float | str]:
        return {"repeated_tokens": self.repeated_tokens, "fresh_tokens": self.fresh_tokens,
                "repeated_mean": self.repeated_mean, "fresh_mean": self.fresh_mean,
                "separation": self.separation, "fresh_raised": self.fresh_raised,
                "seen_in": self.seen_in}


def repeated_mask(prompts: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]],
                  width: int) -> np.ndarray:
    """``(B, width)``: token ``j`` of completion ``i`` already appeared in prompt ``i`` or in
    the completion's first ``j`` tokens."""
    mask = np.zeros((len(outputs), width), dtype=bool)
    for i, (prompt, output) in enumerate(zip(prompts, outputs, strict=True)):
        seen = set(prompt)
        for j, token in enumerate(output[:width]):
            mask[i, j] = token in seen
            seen.add(token)
    return mask


def penalty_signature(delta: np.ndarray, valid: np.ndarray, repeated: np.ndarray,
                      floor: float = 0.0) -> PenaltySignature:
    """Split ``delta`` (``(B, L)`` trainer minus engine log-probs) over the ``valid`` tokens by
    ``repeated`` (:func:`repeated_mask`); fresh tokens within ``floor`` of zero (the precision
    tier's noise) are not counted as moved."""
    rep = delta[valid & repeated].astype(np.float64)
    fresh = delta[valid & ~repeated].astype(np.float64)
    moved = fresh[np.abs(fresh) > floor]
    raised = float((moved < 0).mean()) if moved.size else 0.0
    if rep.size < 2 or fresh.size < 2:
        return PenaltySignature(int(rep.size), int(fresh.size),
                                float(rep.mean()) if rep.size else 0.0,
                                float(fresh.mean()) if fresh.size else 0.0, 0.0, raised)
    gap = float(rep.mean() - fresh.mean())
    stderr = math.sqrt(rep.var(ddof=1) / rep.size + fresh.var(ddof=1) / fresh.size)
    # a gap within the noise floor is no evidence, however small the spread
    separation = gap / stderr if stderr > 0 and gap > floor else 0.0
    return PenaltySignature(int(rep.size), int(fresh.size), float(rep.mean()),
                            float(fresh.mean()), separation, raised)


def read_penalty(delta: np.ndarray, valid: np.ndarray, prompts: Sequence[Sequence[int]],
                 outputs: Sequence[Sequence[int]], floor: float = 0.0) -> PenaltySignature:
    """The delta's penalty signature with tokens counted as repeated when seen before in the
    prompt or completion (a repetition penalty), else in the completion alone (a presence or
    frequency penalty, whose unpenalised prompt repeats would dilute the first split): the
    first with a penalty's shape, else the first."""
    width = delta.shape[1]
    context = penalty_signature(delta, valid, repeated_mask(prompts, outputs, width), floor)
    if context.penalty:
        return context
    alone = penalty_signature(delta, valid, repeated_mask([[] for _ in outputs], outputs, width),
                              floor)
    if not alone.penalty:
        return context
    return PenaltySignature(alone.repeated_tokens, alone.fresh_tokens, alone.repeated_mean,
                            alone.fresh_mean, alone.separation, alone.fresh_raised, "completion")
