"""A penalty read from a token log-prob delta: the penalty that predicts it, fitted.

A repetition, presence or frequency penalty moves known logits by a known rule before the
temperature (vLLM's sampler and HF's processors alike): repetition ``r`` divides a positive
logit (multiplies a negative one) of every token already in the prompt or completion;
presence ``p`` subtracts ``p`` from each token already in the completion, frequency ``f``
subtracts ``f`` times its count there. From the trainer's own logits the engine's log-prob of
each sampled token under a penalty of strength ``s`` is therefore computable, renormalisation
included. :func:`fit_penalty` fits ``s`` for each kind to the observed delta (trainer minus
engine) and reports the share of the squared delta the best one removes: a penalty leaves
almost no residual, different weights, precision noise or a truncation on one side leave most
of it (no penalty strength predicts them).

Only the tokens a penalty touches enter the renormalisation, so each evaluation reads the
seen tokens' logits per position, not the vocabulary: a penalty's sum over the seen tokens
``S`` is ``lse' = lse + log(1 + sum_{v in S} p_v (exp((z'_v - z_v) / T) - 1))``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from paritygate.metrics.search import golden_section

PENALTY_EXPLAINED = 0.8
"""A penalty is named when its fitted strength removes this share of the squared delta."""

KINDS: dict[str, tuple[float, float, float]] = {
    # kind: (neutral value, largest fitted value, smallest change that counts)
    "repetition_penalty": (1.0, 4.0, 0.02),
    "presence_penalty": (0.0, 4.0, 0.05),
    "frequency_penalty": (0.0, 4.0, 0.05),
}
"""The penalties fitted: the neutral value, the bound of the fit and the least change named."""

SEEN_IN = {"repetition_penalty": "prompt or completion", "presence_penalty": "completion",
           "frequency_penalty": "completion"}


@dataclass(frozen=True)
class PenaltyFit:
    """The penalty that best predicts the delta, and how much of it it explains."""

    kind: str
    strength: float
    """The fitted value (``repetition_penalty`` 1.3, ``presence_penalty`` 1.5, ...)."""
    base: float
    """The value the trainer's recompute applies (the neutral one unless declared)."""
    explained: float
    """``1 - SSE(fitted) / SSE(base)``: the share of the squared delta the penalty removes."""
    tokens: int
    delta_rms: float
    residual_rms: float

    @property
    def penalty(self) -> bool:
        """Whether a penalty explains the delta: most of it removed by a strength that differs
        from the trainer's."""
        least = KINDS[self.kind][2]
        return self.explained >= PENALTY_EXPLAINED and abs(self.strength - self.base) > least

    def describe(self) -> str:
        return (f"{self.kind} {self.strength:.3g} on the tokens already in the "
                f"{SEEN_IN[self.kind]} (the trainer's recompute applies {self.base:g}) predicts "
                f"the engine's log-probs from the trainer's logits: it explains "
                f"{self.explained:.0%} of the squared delta over {self.tokens} tokens (rms "
                f"{self.delta_rms:.3g} -> {self.residual_rms:.3g} nats)")

    def as_details(self) -> dict[str, float | str | int]:
        return {"kind": self.kind, "strength": self.strength, "base": self.base,
                "explained": self.explained, "tokens": self.tokens,
                "delta_rms": self.delta_rms, "residual_rms": self.residual_rms,
                "seen_in": SEEN_IN[self.kind]}


@dataclass(frozen=True)
class SeenTokens:
    """Per compared token ``n``: the sampled token's scaled logit, the softmax's log-normaliser,
    and the tokens seen before it (padded to one width, ``mask`` marking the real ones) with
    their scaled logits, probabilities, completion counts and whether the token is the sampled
    one."""

    temperature: float
    token_logit: np.ndarray  # (N,) z_t (unscaled)
    lse: np.ndarray  # (N,) logsumexp(z / T)
    logits: np.ndarray  # (N, S) z_v (unscaled)
    probs: np.ndarray  # (N, S) softmax(z / T)_v
    counts: np.ndarray  # (N, S) occurrences in the completion so far
    is_token: np.ndarray  # (N, S) v is the sampled token
    mask: np.ndarray  # (N, S)

    def logprobs(self, values: Mapping[str, float]) -> np.ndarray:
        """The sampled tokens' log-probs under the penalties ``values`` (kind -> strength)."""
        rep = values.get("repetition_penalty", 1.0)
        z = np.where(self.logits > 0, self.logits / rep, self.logits * rep)
        z = z - values.get("frequency_penalty", 0.0) * self.counts
        z = z - values.get("presence_penalty", 0.0) * (self.counts > 0)
        shift = np.where(self.mask, (z - self.logits) / self.temperature, 0.0)
        with np.errstate(over="ignore"):
            moved = (self.probs * np.expm1(shift)).sum(-1)
        lse = self.lse + np.log1p(np.maximum(moved, -1.0 + 1e-300))
        token_shift = (shift * self.is_token).sum(-1)
        return (self.token_logit / self.temperature + token_shift) - lse


def seen_tokens(rows: Sequence[np.ndarray], prompts: Sequence[Sequence[int]],
                outputs: Sequence[Sequence[int]], valid: np.ndarray,
                temperature: float) -> SeenTokens:
    """Gather, for every ``valid[i, j]`` token, what :class:`SeenTokens` holds. ``rows[i]`` are
    the trainer's next-token logits over completion ``i`` (row ``j`` predicts token ``j``)."""
    t = temperature if temperature > 0 else 1.0
    items: list[tuple[float, float, np.ndarray, np.ndarray, np.ndarray, int]] = []
    for i, (prompt, output) in enumerate(zip(prompts, outputs, strict=True)):
        counts: dict[int, int] = {}
        in_prompt = set(int(x) for x in prompt)
        for j, token in enumerate(output[: valid.shape[1]]):
            if valid[i, j]:
                z = np.asarray(rows[i][j], np.float64)
                scaled = z / t
                top = float(scaled.max())
                lse = top + math.log(float(np.exp(scaled - top).sum()))
                ids = np.fromiter(sorted(in_prompt | counts.keys()), np.int64)
                cnt = np.array([counts.get(int(v), 0) for v in ids], np.float64)
                items.append((float(z[int(token)]), lse, ids, z[ids], cnt, int(token)))
            counts[int(token)] = counts.get(int(token), 0) + 1
    width = max((len(item[2]) for item in items), default=0)
    n = len(items)
    logits, probs, cnts = (np.zeros((n, width)) for _ in range(3))
    is_token, mask = np.zeros((n, width), bool), np.zeros((n, width), bool)
    for k, (_, lse, ids, z_seen, cnt, token) in enumerate(items):
        m = len(ids)
        logits[k, :m], cnts[k, :m], mask[k, :m] = z_seen, cnt, True
        probs[k, :m] = np.exp(z_seen / t - lse)
        is_token[k, :m] = ids == token
    return SeenTokens(t, np.array([it[0] for it in items]), np.array([it[1] for it in items]),
                      logits, probs, cnts, is_token, mask)


def fit_penalty(seen: SeenTokens, delta: np.ndarray,
                applied: Mapping[str, float] | None = None) -> PenaltyFit:
    """The penalty kind and strength that best predict ``delta`` (trainer minus engine
    log-prob of each token :func:`seen_tokens` gathered, same order), the trainer's recompute
    applying ``applied`` (kind -> value it declares) and the engine the same with one kind's
    value fitted. Golden-section search per kind over ``[neutral, bound]``."""
    base_values = {kind: (applied or {}).get(kind, KINDS[kind][0]) for kind in KINDS}
    observed = np.asarray(delta, np.float64)
    base = seen.logprobs(base_values)
    total = float(np.square(observed).sum())
    best: PenaltyFit | None = None
    for kind, (neutral, bound, _) in KINDS.items():

        def sse(value: float, kind: str = kind) -> float:
            predicted = base - seen.logprobs({**base_values, kind: value})
            return float(np.square(observed - predicted).sum())

        value = golden_section(sse, neutral, bound)
        residual = sse(value)
        explained = 1.0 - residual / total if total > 0 else 0.0
        fit = PenaltyFit(kind, value, base_values[kind], explained, observed.size,
                         math.sqrt(total / max(1, observed.size)),
                         math.sqrt(residual / max(1, observed.size)))
        if best is None or fit.explained > best.explained:
            best = fit
    assert best is not None
    return best


