"""The in-loop mismatch meter: ``paritygate.mismatch(logp_train, logp_infer, mask)``.

A training loop that samples with one engine (vLLM, SGLang, HF ``generate``) and recomputes
log-probs with another (the trainer) should log how far the two disagree at every step, before
the disagreement turns into a collapse. This is the gate's ``logprob_delta`` statistics, lean
enough to call on every batch: one conversion to float64 numpy, no per-token records, and the
same diagnosis rules (:func:`paritygate.metrics.logprob._diagnose`). Names follow verl's
rollout-correction metrics so a dashboard reads the same whichever framework logs them.

Inputs are torch tensors (any device, any float dtype, bf16 included) or numpy arrays;
``import paritygate`` never imports torch: a tensor is recognised by its ``detach`` method.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from paritygate.metrics.logprob import _diagnose
from paritygate.metrics.logprob_correction import IS_CAP
from paritygate.metrics.tiers import PRECISION_TIERS

__all__ = ["Mismatch", "mismatch"]

_FLOAT_FIELDS = (
    "mismatch_kl",
    "mismatch_k3_kl",
    "delta_mean",
    "delta_std",
    "delta_max_abs",
    "delta_p99_abs",
    "probs_diff_mean",
    "probs_diff_std",
    "probs_diff_max",
    "probs_pearson_corr",
    "log_ppl_diff",
    "log_ppl_abs_diff",
    "ppl_ratio",
    "ratio_clip_frac",
    "is_ratio_mean",
    "is_ratio_frac_high",
    "is_ratio_frac_low",
    "is_eff_sample_size",
    "chi2_token",
    "catastrophic_token_frac",
)


@dataclass(frozen=True)
class Mismatch:
    """Train/inference log-prob mismatch of one batch (``delta = logp_train - logp_infer``).

    Every statistic is over the masked tokens whose two log-probs are finite; with none
    left, the statistics are NaN (a loop that logs them sees the gap, never a zero).
    """

    n_tokens: int
    """Compared tokens (masked and finite on both sides)."""
    nonfinite_tokens: int
    """Masked tokens with NaN/Inf in either input (left out of every statistic)."""
    mismatch_kl: float
    """k1 estimate of KL(pi_infer || pi_train): ``mean(logp_infer - logp_train)`` (verl name)."""
    mismatch_k3_kl: float
    """k3 estimate of the same KL: ``mean(r - 1 - log r)``, ``r = exp(delta)``; >= 0."""
    delta_mean: float
    delta_std: float
    delta_max_abs: float
    delta_p99_abs: float
    probs_diff_mean: float
    """``|exp(logp_train) - exp(logp_infer)|``: mean, std and max (verl's
    ``training/rollout_probs_diff_*``)."""
    probs_diff_std: float
    probs_diff_max: float
    probs_pearson_corr: float
    """Pearson r of the two sides' token probabilities (near 1 unless misaligned)."""
    log_ppl_diff: float
    """Per-token normalised, per sequence: mean over sequences of
    ``mean_t logp_infer - mean_t logp_train`` = ``log(PPL_train / PPL_infer)``."""
    log_ppl_abs_diff: float
    """Mean over sequences of the absolute per-sequence value above."""
    ppl_ratio: float
    """Mean over sequences of ``PPL_train / PPL_infer``."""
    ratio_clip_frac: float
    """Share of tokens whose ratio ``exp(delta)`` is outside ``[1 - eps, 1 + eps]`` (the PPO
    clip range) before any update: the clip fraction the mismatch alone causes."""
    is_ratio_mean: float
    """Mean token importance ratio ``exp(delta)`` (1 when the two sides agree)."""
    is_ratio_frac_high: float
    """Share of tokens with ratio above ``cap`` (truncated-IS cap, 2 by default)."""
    is_ratio_frac_low: float
    """Share of tokens with ratio below ``1 / cap``."""
    is_eff_sample_size: float
    """``(sum w)^2 / (S sum w^2)`` over sequence weights ``w = exp(sum delta)``: 1 when every
    sequence weighs the same, 1/S when one dominates."""
    chi2_token: float
    """``mean((r - 1)^2)``: the chi-squared divergence estimate (variance of the IS weight)."""
    catastrophic_token_frac: float
    """Share of tokens whose probabilities differ by more than 100x (``|delta| > ln 100``)."""
    labels: tuple[str, ...]
    """The diagnosis labels (``consistent``, ``systematic bias``, ``noise``, ``outlier tokens``,
    ``misalignment``, ``non-finite``, ``no tokens``), the gate's ``logprob_delta`` rules."""
    diagnosis: str
    """One line explaining the labels."""
    tier: str
    """The precision tier the diagnosis judged against (``fp32/fp32`` by default)."""

    @property
    def consistent(self) -> bool:
        """True when the diagnosis found nothing: within the tier, no bias, no outliers."""
        return self.labels == ("consistent",)

    def as_dict(self, prefix: str = "mismatch/") -> dict[str, float]:
        """Flat ``{prefix + name: float}`` for a tracker (``wandb.log``, ``trainer.log``,
        ``SummaryWriter.add_scalar``); ``consistent`` is 1.0 or 0.0, the counts are floats."""
        values: dict[str, float] = {
            f"{prefix}{name}": float(getattr(self, name)) for name in _FLOAT_FIELDS
        }
        values[f"{prefix}n_tokens"] = float(self.n_tokens)
        values[f"{prefix}nonfinite_tokens"] = float(self.nonfinite_tokens)
        values[f"{prefix}consistent"] = 1.0 if self.consistent else 0.0
        return values

    def to_json(self) -> dict[str, Any]:
        """Every field, JSON-ready (NaN as ``None``)."""
        out = asdict(self)
        out["labels"] = list(self.labels)
        return {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in out.items()
        }


def _to_numpy(name: str, value: Any, dtype: Any) -> np.ndarray:
    """A torch tensor (any device, any dtype) or array-like as a 2-D numpy array."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # torch.Tensor, without importing it
        tensor = value.detach()
        if tensor.is_floating_point() and dtype is not bool:
            tensor = tensor.double()  # bf16/fp16 have no numpy dtype; float64 is what we compute in
        value = tensor.cpu().numpy()
    arr = np.asarray(value, dtype=dtype)
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2:
        raise ValueError(f"{name} must be (B, L) or (L,), got shape {arr.shape}")
    return arr


def mismatch(
    logp_train: Any,
    logp_infer: Any,
    mask: Any = None,
    *,
    eps: float = 0.2,
    cap: float = IS_CAP,
    tier: str | Mapping[str, float] = "fp32/fp32",
) -> Mismatch:
    """Measure ``logp_train - logp_infer`` on the sampled tokens of one batch.

    ``logp_train`` are the trainer's log-probs of the sampled tokens, ``logp_infer`` the
    engine's, both ``(B, L)`` (or ``(L,)``); ``mask`` (same shape, bool or 0/1) selects the
    generated tokens (pads and prompt excluded); ``None`` compares every position.
    ``eps`` is the PPO clip range of ``ratio_clip_frac``, ``cap`` the truncated-IS cap of
    ``is_ratio_frac_*``, ``tier`` the precision tier (a key of
    :data:`paritygate.metrics.tiers.PRECISION_TIERS` such as ``bf16/bf16``, or its thresholds)
    the diagnosis judges noise and bias against. Raises ``ValueError`` on mismatched shapes
    or an unknown tier.
    """
    train = _to_numpy("logp_train", logp_train, np.float64)
    infer = _to_numpy("logp_infer", logp_infer, np.float64)
    sel = np.ones(train.shape, bool) if mask is None else _to_numpy("mask", mask, bool)
    if not train.shape == infer.shape == sel.shape:
        raise ValueError(
            f"shape mismatch: logp_train {train.shape}, logp_infer {infer.shape}, mask {sel.shape}"
        )
    if isinstance(tier, str):
        if tier not in PRECISION_TIERS:
            raise ValueError(f"unknown tier {tier!r}; known: {', '.join(PRECISION_TIERS)}")
        tier_name, tier_map = tier, dict(PRECISION_TIERS[tier])
    else:
        tier_name, tier_map = "custom", dict(tier)

    finite = np.isfinite(train) & np.isfinite(infer)
    valid = sel & finite  # (B, L)
    nonfinite = int((sel & ~finite).sum())
    seq_idx = np.nonzero(valid)[0]  # (N,) row-major
    lt, li = train[valid], infer[valid]  # (N,)
    delta = lt - li
    labels, diagnosis, _ = _diagnose(delta, tier_map, nonfinite, lt, li)
    n = int(delta.size)
    if not n:
        nan = float("nan")
        values = dict.fromkeys(_FLOAT_FIELDS, nan)
    else:
        values = _statistics(delta, lt, li, seq_idx, train.shape[0], eps, cap)
    return Mismatch(
        n_tokens=n, nonfinite_tokens=nonfinite, labels=tuple(labels), diagnosis=diagnosis,
        tier=tier_name, **values,
    )


def _statistics(
    delta: np.ndarray,
    lt: np.ndarray,
    li: np.ndarray,
    seq_idx: np.ndarray,
    n_rows: int,
    eps: float,
    cap: float,
) -> dict[str, float]:
    """The float fields of :class:`Mismatch` for ``N >= 1`` compared tokens."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        abs_delta = np.abs(delta)
        ratio = np.exp(delta)  # (N,) pi_train / pi_infer
        p_train, p_infer = np.exp(lt), np.exp(li)
        probs_diff = np.abs(p_train - p_infer)
        counts = np.bincount(seq_idx, minlength=n_rows)
        have = counts > 0
        seq_sum = np.bincount(seq_idx, weights=delta, minlength=n_rows)[have]  # (S,)
        per_token = seq_sum / counts[have]  # mean delta per sequence
        w = np.exp(seq_sum)
        ess = float(w.sum() ** 2 / (w.size * np.square(w).sum()))
        c_train, c_infer = p_train - p_train.mean(), p_infer - p_infer.mean()
        norm = math.sqrt(float(np.dot(c_train, c_train)) * float(np.dot(c_infer, c_infer)))
        corr = float(np.dot(c_train, c_infer)) / norm if norm > 0 else float("nan")
        lo, hi = math.log(1.0 / cap), math.log(cap)
        mean = float(delta.mean())
        return {
            "mismatch_kl": -mean,
            # expm1(d) - d is r - 1 - log r without cancellation for tiny d.
            "mismatch_k3_kl": float(np.mean(np.expm1(delta) - delta)),
            "delta_mean": mean,
            "delta_std": float(math.sqrt(float(np.dot(delta - mean, delta - mean)) / delta.size)),
            "delta_max_abs": float(abs_delta.max()),
            "delta_p99_abs": float(np.quantile(abs_delta, 0.99)),
            "probs_diff_mean": float(probs_diff.mean()),
            "probs_diff_std": float(probs_diff.std()),
            "probs_diff_max": float(probs_diff.max()),
            "probs_pearson_corr": corr,
            "log_ppl_diff": float(-per_token.mean()),
            "log_ppl_abs_diff": float(np.abs(per_token).mean()),
            "ppl_ratio": float(np.exp(-per_token).mean()),
            "ratio_clip_frac": float(np.mean((ratio < 1.0 - eps) | (ratio > 1.0 + eps))),
            "is_ratio_mean": float(ratio.mean()),
            "is_ratio_frac_high": float(np.mean(delta > hi)),
            "is_ratio_frac_low": float(np.mean(delta < lo)),
            "is_eff_sample_size": ess,
            "chi2_token": float(np.mean(np.square(ratio - 1.0))),
            "catastrophic_token_frac": float(np.mean(abs_delta > math.log(100.0))),
        }
