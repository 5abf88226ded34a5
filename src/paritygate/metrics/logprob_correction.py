"""Trainer/engine log-prob corrections: the temperature ratio that explains a delta, and the
rollout-correction (importance ratio) metrics over the compared tokens
(:func:`paritygate.metrics.logprob.delta_stats` reports both)."""

from __future__ import annotations

import math

import numpy as np

from paritygate.metrics.search import golden_section

TEMPERATURE_EXPLAINED = 0.8
"""A temperature mismatch is named when rescaling the trainer's logits by one factor explains
this share of the squared delta (:func:`fit_temperature_ratio`). On the demo LM a T = 0.8 vs
1.0 mismatch is explained to > 99%, stale weights (2% noise on every matrix) to < 5%."""

TEMPERATURE_MIN_CHANGE = 0.01
"""Fitted ratios within 1% of 1 are not reported as a temperature mismatch."""


def fit_temperature_ratio(
    logits: np.ndarray, tokens: np.ndarray, logp_infer: np.ndarray, t_train: float
) -> tuple[float, float]:
    """The temperature ratio that best explains the engine's log-probs from the trainer's logits.

    ``logits`` (N, V) are the trainer's raw next-token logits of the N compared tokens,
    ``tokens`` (N,) the tokens and ``logp_infer`` (N,) the engine's log-probs. The engine is
    modelled as sampling at ``T_engine = ratio * t_train``:
    ``logp_infer ~ log_softmax(logits / T_engine)[token]``. Returns ``(ratio, explained)``
    with ``explained = 1 - SSE(ratio) / SSE(1)`` (share of the squared delta the fit removes).
    The ratio is found by golden-section search on log(ratio) in [1/4, 4].
    """
    z = np.asarray(logits, np.float64)
    idx = np.asarray(tokens, np.int64)
    target = np.asarray(logp_infer, np.float64)

    def sse(log_ratio: float) -> float:
        scaled = z / (t_train * math.exp(log_ratio))
        top = scaled.max(-1, keepdims=True)
        lse = top[:, 0] + np.log(np.exp(scaled - top).sum(-1))
        pred = scaled[np.arange(len(idx)), idx] - lse
        return float(np.square(target - pred).sum())

    lo, hi = math.log(0.25), math.log(4.0)
    best = golden_section(sse, lo, hi, steps=60)
    base = sse(0.0)
    explained = 1.0 - sse(best) / base if base > 0 else 0.0
    return math.exp(best), explained

IS_CAP = 2.0
"""Importance-ratio cap c of the rollout-correction metrics (truncated IS, C = 2 in Yao et al.)."""

CATASTROPHIC_LOG_RATIO = math.log(100.0)
"""A token is catastrophic when trainer and engine probabilities differ by more than 100x."""


def rollout_correction(
    delta: np.ndarray, seq_idx: np.ndarray, n_seqs: int, *, cap: float = IS_CAP
) -> dict[str, float]:
    """Train/rollout mismatch metrics of the rollout-correction family, over compared tokens.

    With per-token ratio ``r = exp(delta) = pi_train / pi_rollout`` and per sequence ``s``
    the token count ``n_s`` and summed delta ``D_s``:

    - ``token_ratio_mean`` = mean r; ``token_outside_frac`` = share of tokens with r outside
      ``[1/c, c]``;
    - ``seq_ratio_mean`` = mean over sequences of ``exp(D_s)``; ``seq_outside_frac``;
    - ``geo_ratio_mean`` = mean over sequences of ``exp(D_s / n_s)``; ``geo_outside_frac``;
    - ``ess`` = ``(sum w)^2 / (S * sum w^2)`` with ``w = exp(D_s)``: 1 when every sequence
      weighs the same, 1/S when one dominates;
    - ``chi2`` = mean over tokens of ``(r - 1)^2`` (the chi-squared divergence estimate);
    - ``ppl_ratio`` = ``PPL_train / PPL_rollout = exp(-mean delta)``;
    - ``catastrophic_frac`` = share of tokens with ``|delta| > ln 100``.
    """
    nan = float("nan")
    if delta.size == 0:
        return dict.fromkeys(
            ("token_ratio_mean", "token_outside_frac", "seq_ratio_mean", "seq_outside_frac",
             "geo_ratio_mean", "geo_outside_frac", "ess", "chi2", "ppl_ratio",
             "catastrophic_frac"), nan)
    lo, hi = math.log(1.0 / cap), math.log(cap)
    with np.errstate(over="ignore", invalid="ignore"):
        r = np.exp(delta)
        sums = np.bincount(seq_idx, weights=delta, minlength=n_seqs)
        counts = np.bincount(seq_idx, minlength=n_seqs)
        have = counts > 0
        seq_log = sums[have]
        geo_log = sums[have] / counts[have]
        w = np.exp(seq_log)
        ess = float(w.sum() ** 2 / (w.size * np.square(w).sum())) if w.size else nan
        return {
            "token_ratio_mean": float(r.mean()),
            "token_outside_frac": float(np.mean((delta < lo) | (delta > hi))),
            "seq_ratio_mean": float(w.mean()),
            "seq_outside_frac": float(np.mean((seq_log < lo) | (seq_log > hi))),
            "geo_ratio_mean": float(np.exp(geo_log).mean()),
            "geo_outside_frac": float(np.mean((geo_log < lo) | (geo_log > hi))),
            "ess": ess,
            "chi2": float(np.mean(np.square(r - 1.0))),
            "ppl_ratio": float(math.exp(-float(delta.mean()))),
            "catastrophic_frac": float(np.mean(np.abs(delta) > CATASTROPHIC_LOG_RATIO)),
        }
