"""Statistics of ``logp_train - logp_infer`` on generated tokens (numpy only).

The inference engine samples a response and reports the log-prob of each
sampled token (``logp_infer``); the trainer recomputes them (``logp_train``).
In on-policy RL the two must agree: their ratio ``exp(logp_train - logp_infer)``
is the importance weight PPO/GRPO implicitly assume to be 1 before any update.
:func:`delta_stats` summarises the delta, says what shape the disagreement has
(systematic bias, noise, a few outlier tokens) and lists the worst tokens.
:data:`PRECISION_TIERS` holds what "agree" means for each pair of dtypes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypedDict

import numpy as np
from numpy.typing import DTypeLike

from paritygate.metrics.logprob_correction import rollout_correction
from paritygate.metrics.tiers import PRECISION_TIERS, tier_for

__all__ = ["PRECISION_TIERS", "DeltaStats", "delta_stats", "tier_for"]

_METRIC_NAMES = (
    "delta_mean", "delta_std", "delta_max_abs", "delta_p99_abs", "prob_diff_mean",
    "prob_diff_max", "k3_kl", "ratio_outside_frac", "n_tokens", "nonfinite_tokens",
)

OUTLIER_FACTOR = 10.0
"""A token is an outlier when its |delta| exceeds this many times the bulk level (see below)."""

BIAS_SIGMAS = 3.0
"""|mean| must exceed this many standard errors (std / sqrt(n)) to count as a bias."""

GAUSS_P99 = 2.5758
"""99th percentile of |N(0, 1)|: a zero-mean Gaussian with std s has p99 |delta| = 2.5758 s."""

MISALIGNED_CORR = 0.9
"""Pearson correlation of logp_train and logp_infer below which the two sides are scoring
different tokens or contexts (misalignment). Both noise and a temperature mismatch keep it
near 1: on the demo a T=0.8 vs 1.0 mismatch gives r > 0.99, stale weights r > 0.99; right
padding (the engine continues from pad tokens) gives r well below 0.9."""

def _noise_tier(std: float) -> str | None:
    """The most precise tier whose noise allowance (p99 / 2.5758) covers ``std``."""
    fits = [
        (float(t["delta_p99_abs"]), key)
        for key, t in PRECISION_TIERS.items()
        if std <= float(t["delta_p99_abs"]) / GAUSS_P99
    ]
    return min(fits)[1] if fits else None


class _WorstTokenBase(TypedDict):
    seq: int
    pos: int
    delta: float
    logp_train: float
    logp_infer: float
    outlier: bool
    nonfinite: bool


class WorstToken(_WorstTokenBase, total=False):
    """One of the worst tokens of :func:`delta_stats` (``text`` only with a decoder)."""
    text: str


@dataclass
class DeltaStats:
    """Summary of one comparison; metrics are NaN when no finite token was compared."""

    delta_mean: float
    delta_std: float
    delta_max_abs: float
    delta_p99_abs: float
    prob_diff_mean: float
    prob_diff_max: float
    k3_kl: float
    ratio_outside_frac: float
    n_tokens: int
    nonfinite_tokens: int
    eps: float
    diagnosis: str
    labels: list[str]
    worst: list[WorstToken]
    per_sequence: list[dict[str, float]]
    per_bucket: list[dict[str, float]]
    per_token: list[dict[str, float]] = field(repr=False)
    tier: dict[str, float] = field(default_factory=dict)
    correction: dict[str, float] = field(default_factory=dict)
    """Rollout-correction metrics (:func:`rollout_correction`)."""

    def as_metrics(self) -> dict[str, float]:
        """The flat metric names the checks report."""
        return {name: float(getattr(self, name)) for name in _METRIC_NAMES}

    def to_details(self) -> dict[str, object]:
        """Everything, JSON-serialisable (NaN written as ``None``)."""
        details: dict[str, object] = {
            "metrics": self.as_metrics(),
            "eps": self.eps,
            "diagnosis": self.diagnosis,
            "labels": list(self.labels),
            "tier": dict(self.tier),
            "worst": self.worst,
            "per_sequence": self.per_sequence,
            "per_bucket": self.per_bucket,
            "per_token": self.per_token,
            "correction": self.correction,
        }
        return {key: _jsonable(value) for key, value in details.items()}


def _jsonable(value: object) -> object:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    return value


def _as_2d(name: str, array: object, dtype: DTypeLike) -> np.ndarray:
    arr = np.asarray(array, dtype=dtype)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be (B, L), got shape {arr.shape}")
    return arr


def _bulk_level(abs_delta: np.ndarray) -> tuple[float, int]:
    """|delta| of the largest token once the worst 1% (at least one token) is set aside.

    Returns ``(level, k)`` with ``k`` the number of tokens set aside; ``level`` is
    0 when fewer than two tokens exist.
    """
    n = abs_delta.size
    k = max(1, math.floor(0.01 * n))
    if n <= k:
        return 0.0, k
    # The (n - k - 1)-th order statistic; a partial partition, not a full sort (O(n)).
    return float(np.partition(abs_delta, n - k - 1)[n - k - 1]), k


def _diagnose(
    delta: np.ndarray,
    tier: Mapping[str, float],
    nonfinite: int,
    lt: np.ndarray | None = None,
    li: np.ndarray | None = None,
) -> tuple[list[str], str, np.ndarray]:
    """Labels, one explanatory line, and the mask of outlier tokens.

    Rules, in order (several labels can apply):

    - ``non-finite``: some masked token had NaN/Inf in either input.
    - ``outlier tokens``: ``max|delta|`` exceeds both the tier's ``delta_max_abs``
      and ``OUTLIER_FACTOR`` x the bulk level (the largest |delta| once the worst
      1% of tokens, at least one, is set aside). Tokens above that cut are the
      outliers; bias and noise are then judged on the remaining tokens so that a
      single broken token does not also read as noise.
    - ``systematic bias``: ``|mean| > BIAS_SIGMAS * std / sqrt(n)`` (significant)
      and ``|mean|`` above the tier's ``delta_mean_abs`` (material).
    - ``noise``: ``std > tier.delta_p99_abs / 2.5758``, i.e. a zero-mean Gaussian
      with that spread would put its 99th-percentile |delta| past the tier.
    - ``misalignment``: Pearson r of logp_train and logp_infer below ``MISALIGNED_CORR``
      (replaces bias and noise).
    - (a temperature mismatch needs the trainer's logits: see :func:`fit_temperature_ratio`,
      which ``logprob_delta`` runs when the delta breaches its tier.)
    - the noise label says which precision tier a zero-mean spread of that size fits, or that
      it is larger than any tier's (different weights, not precision).
    - ``consistent``: none of the above.
    """
    labels: list[str] = []
    parts: list[str] = []
    outliers = np.zeros(delta.shape, dtype=bool)
    if nonfinite:
        labels.append("non-finite")
        parts.append(f"non-finite: {nonfinite} token(s) have NaN/Inf log-probs")
    if delta.size == 0:
        if not labels:
            labels.append("no tokens")
            parts.append("no tokens: the mask selects no finite token")
        return labels, "; ".join(parts), outliers
    abs_delta = np.abs(delta)
    max_abs = float(abs_delta.max())
    bulk, _ = _bulk_level(abs_delta)
    cut = max(OUTLIER_FACTOR * bulk, float(tier["delta_max_abs"]))
    if max_abs > cut:
        outliers = abs_delta > cut
        labels.append("outlier tokens")
        parts.append(
            f"outlier tokens: {int(outliers.sum())} token(s) with |delta| > {cut:.3g} "
            f"(max {max_abs:.3g}, bulk level {bulk:.3g})"
        )
    rest = delta[~outliers]
    shaped = False
    if lt is not None and li is not None and rest.size >= 10 and float(rest.std()) > float(
        tier["delta_p99_abs"]
    ) / GAUSS_P99:
        a_t, a_i = lt[~outliers], li[~outliers]
        corr = float(np.corrcoef(a_t, a_i)[0, 1]) if a_t.std() > 0 and a_i.std() > 0 else 1.0
        if corr < MISALIGNED_CORR:
            shaped = True
            labels.append("misalignment")
            parts.append(
                f"misalignment: trainer and engine log-probs correlate at r = {corr:.3f} "
                f"(< {MISALIGNED_CORR}): the two sides score different tokens or contexts "
                "(padding side, shifted positions, another prompt)"
            )
    if rest.size and not shaped:
        mean = float(rest.mean())
        std = float(rest.std())
        stderr = std / math.sqrt(rest.size)
        if abs(mean) > BIAS_SIGMAS * stderr and abs(mean) > float(tier["delta_mean_abs"]):
            labels.append("systematic bias")
            side = "trainer higher" if mean > 0 else "engine higher"
            parts.append(
                f"systematic bias: mean delta {mean:+.3g} ({side}), "
                f"{abs(mean) / stderr if stderr > 0 else math.inf:.1f} standard errors from 0"
            )
        noise_std = float(tier["delta_p99_abs"]) / GAUSS_P99
        if std > noise_std:
            labels.append("noise")
            fits = _noise_tier(std)
            where = (
                f"the size of {fits} precision noise (is one side in lower precision?)"
                if fits
                else "larger than any precision tier's noise: not precision (different "
                "weights or model? see weights_load)"
            )
            parts.append(
                f"noise: std {std:.3g} > {noise_std:.3g} allowed by the precision tier; "
                f"zero-mean spread {where}"
            )
    if not labels:
        labels.append("consistent")
        parts.append("consistent: delta within the precision tier, no bias, no outliers")
    return labels, "; ".join(parts), outliers


def _per_sequence(
    delta_full: np.ndarray, valid: np.ndarray, nonfinite_rows: np.ndarray
) -> list[dict[str, float]]:
    rows: list[dict[str, float]] = []
    for i in range(delta_full.shape[0]):
        d = delta_full[i][valid[i]]
        rows.append(
            {
                "seq": i,
                "n_tokens": int(d.size),
                "nonfinite_tokens": int(nonfinite_rows[i]),
                "mean": float(d.mean()) if d.size else float("nan"),
                "max_abs": float(np.abs(d).max()) if d.size else float("nan"),
            }
        )
    return rows


def _per_bucket(delta: np.ndarray, pos: np.ndarray, buckets: int) -> list[dict[str, float]]:
    """Quantile buckets of position (equal token counts where positions allow)."""
    if delta.size == 0 or buckets < 1:
        return []
    edges = np.unique(np.quantile(pos, np.linspace(0.0, 1.0, buckets + 1), method="nearest"))
    rows: list[dict[str, float]] = []
    lo = int(pos.min()) - 1
    for hi in edges.astype(int):
        sel = (pos > lo) & (pos <= hi)
        if sel.any():
            d = delta[sel]
            rows.append(
                {
                    "pos_lo": int(pos[sel].min()),
                    "pos_hi": int(hi),
                    "n_tokens": int(d.size),
                    "mean": float(d.mean()),
                    "max_abs": float(np.abs(d).max()),
                }
            )
        lo = int(hi)
    return rows


def _worst_tokens(
    delta: np.ndarray,
    seq_idx: np.ndarray,
    pos_idx: np.ndarray,
    lt: np.ndarray,
    li: np.ndarray,
    outliers: np.ndarray,
    nonfinite_at: np.ndarray,
    train: np.ndarray,
    infer: np.ndarray,
    *,
    token_text: Callable[[int, int], str] | None,
    worst_k: int,
) -> list[WorstToken]:
    """Non-finite tokens first (up to ``worst_k``), then the ``worst_k`` largest |delta|."""
    k = max(0, worst_k)
    rows: list[WorstToken] = []
    for s, p in nonfinite_at[:k]:
        s, p = int(s), int(p)
        rows.append(
            {
                "seq": s,
                "pos": p,
                "delta": float("nan"),
                "logp_train": float(train[s, p]),
                "logp_infer": float(infer[s, p]),
                "outlier": False,
                "nonfinite": True,
            }
        )
    for i in np.argsort(-np.abs(delta), kind="stable")[:k]:
        rows.append(
            {
                "seq": int(seq_idx[i]),
                "pos": int(pos_idx[i]),
                "delta": float(delta[i]),
                "logp_train": float(lt[i]),
                "logp_infer": float(li[i]),
                "outlier": bool(outliers[i]),
                "nonfinite": False,
            }
        )
    if token_text is not None:
        for row in rows:
            row["text"] = token_text(row["seq"], row["pos"])
    return rows


def delta_stats(
    logp_train: np.ndarray,
    logp_infer: np.ndarray,
    mask: np.ndarray,
    *,
    eps: float = 0.2,
    token_text: Callable[[int, int], str] | None = None,
    buckets: int = 4,
    worst_k: int = 5,
    tier: Mapping[str, float] | None = None,
) -> DeltaStats:
    """Compare trainer and engine log-probs of the sampled tokens.

    All inputs are ``(B, L)``: row ``i``, column ``j`` is token ``j`` of response
    ``i``; ``mask`` selects the generated tokens to compare (pads excluded).
    ``delta = logp_train - logp_infer`` (float64). Masked tokens where either
    input is NaN/Inf are counted in ``nonfinite_tokens`` and left out of every
    other statistic; when no finite token remains the statistics are NaN, so
    a check built on them fails instead of passing on nothing.

    - ``prob_diff_*``: ``|exp(logp_train) - exp(logp_infer)|``.
    - ``k3_kl``: tokens were sampled from the engine's policy q, so with
      ``r = p_train / p_infer = exp(delta)`` the k3 estimator
      ``mean(r - 1 - log r)`` is an unbiased, non-negative estimate of
      ``KL(q_infer || p_train)`` per token.
    - ``ratio_outside_frac``: fraction of tokens whose ratio ``exp(delta)``
      lies outside ``[1 - eps, 1 + eps]`` (the PPO clip range) before any update.
    - ``worst``: the ``worst_k`` tokens by |delta| with ``seq``, ``pos``, both
      log-probs and ``text = token_text(seq, pos)`` when given.
    - ``tier``: thresholds used by the diagnosis (default ``fp32/fp32``, the
      strictest); see :func:`_diagnose` for the rules.
    """
    train = _as_2d("logp_train", logp_train, np.float64)
    infer = _as_2d("logp_infer", logp_infer, np.float64)
    sel = _as_2d("mask", mask, bool)
    if not train.shape == infer.shape == sel.shape:
        raise ValueError(
            f"shape mismatch: logp_train {train.shape}, logp_infer {infer.shape}, mask {sel.shape}"
        )
    tier_map = dict(tier if tier is not None else PRECISION_TIERS["fp32/fp32"])

    finite = np.isfinite(train) & np.isfinite(infer)
    valid = sel & finite  # (B, L) compared tokens
    nonfinite_mask = sel & ~finite
    nonfinite = int(nonfinite_mask.sum())
    with np.errstate(invalid="ignore", over="ignore"):
        delta_full = np.where(valid, train - infer, 0.0)  # (B, L)
    seq_idx, pos_idx = np.nonzero(valid)  # row-major: flat token order
    delta = delta_full[seq_idx, pos_idx]  # (N,)
    lt = train[seq_idx, pos_idx]
    li = infer[seq_idx, pos_idx]
    n = int(delta.size)

    labels, diagnosis, outliers = _diagnose(delta, tier_map, nonfinite, lt, li)
    values = _headline(delta, lt, li, eps)
    worst = _worst_tokens(
        delta,
        seq_idx,
        pos_idx,
        lt,
        li,
        outliers,
        np.argwhere(nonfinite_mask),
        train,
        infer,
        token_text=token_text,
        worst_k=worst_k,
    )
    return DeltaStats(
        **values,
        n_tokens=n,
        nonfinite_tokens=nonfinite,
        eps=float(eps),
        diagnosis=diagnosis,
        labels=labels,
        worst=worst,
        per_sequence=_per_sequence(delta_full, valid, nonfinite_mask.sum(axis=1)),
        per_bucket=_per_bucket(delta, pos_idx, buckets),
        per_token=[{"seq": int(s), "pos": int(p), "delta": float(d)}
                   for s, p, d in zip(seq_idx, pos_idx, delta, strict=True)],
        tier=tier_map,
        correction=rollout_correction(delta, seq_idx, train.shape[0]),
    )


def _headline(delta: np.ndarray, lt: np.ndarray, li: np.ndarray, eps: float) -> dict[str, float]:
    """The eight headline statistics of ``delta`` (N,) over compared tokens; NaN when N = 0."""
    if not delta.size:
        return {name: float("nan") for name in _METRIC_NAMES[:8]}
    # A huge |delta| overflows exp to inf: the metric turns non-finite and fails by name.
    with np.errstate(over="ignore"):
        abs_delta = np.abs(delta)
        ratio = np.exp(delta)
        prob_diff = np.abs(np.exp(lt) - np.exp(li))
        return {
            "delta_mean": float(delta.mean()),
            "delta_std": float(delta.std()),
            "delta_max_abs": float(abs_delta.max()),
            "delta_p99_abs": float(np.quantile(abs_delta, 0.99)),
            "prob_diff_mean": float(prob_diff.mean()),
            "prob_diff_max": float(prob_diff.max()),
            # expm1(d) - d is r - 1 - log r without cancellation for tiny d.
            "k3_kl": float(np.mean(np.expm1(delta) - delta)),
            "ratio_outside_frac": float(np.mean((ratio < 1.0 - eps) | (ratio > 1.0 + eps))),
        }
