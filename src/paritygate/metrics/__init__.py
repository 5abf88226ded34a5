"""Numeric comparison helpers (numpy only): differences and action-distribution distances.

All functions are pure and deterministic; they compute in float64 so the metric
itself adds no rounding noise to what it measures.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class DiffStats:
    """Absolute and relative differences of two same-shape arrays (NaN throughout when the
    difference holds NaN/Inf)."""

    max_abs: float
    mean_abs: float
    p99_abs: float
    max_rel: float

    def as_dict(self) -> dict[str, float]:
        """The four statistics by name, for reports."""
        return asdict(self)


@dataclass(frozen=True)
class DistributionStats:
    """Distances between two categorical action distributions (see
    :func:`distribution_stats`)."""

    kl_mean: float
    kl_max: float
    tv_mean: float
    tv_max: float
    topk_overlap: float
    argmax_agreement: float
    worst: list[int] = field(default_factory=list)
    kl_per_row: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        """The statistics by name, for reports."""
        return asdict(self)


@dataclass(frozen=True)
class LogitsComparison:
    """What ``logits_agreement.compare_logits`` measured: the element-wise differences and,
    for categorical outputs, the distances between the two distributions."""

    diff: DiffStats
    dist: DistributionStats | None = None

    def as_dict(self) -> dict[str, object]:
        """The statistics by name (the diff's, then the distribution's), for reports."""
        return {**self.diff.as_dict(), **(self.dist.as_dict() if self.dist else {})}


def finite_report(name: str, array: np.ndarray) -> str | None:
    """A cause line when ``array`` holds NaN or Inf, else ``None``."""
    arr = np.asarray(array)
    if not np.issubdtype(arr.dtype, np.floating):
        return None
    n_nan = int(np.isnan(arr).sum())
    n_inf = int(np.isinf(arr).sum())
    if n_nan == 0 and n_inf == 0:
        return None
    parts = [f"{n} {kind}" for n, kind in ((n_nan, "NaN"), (n_inf, "Inf")) if n]
    return f"{name} has {' and '.join(parts)} values"


def diff_stats(reference: np.ndarray, candidate: np.ndarray) -> DiffStats:
    """Max / mean / p99 absolute and max relative difference of two same-shape arrays."""
    ref = np.asarray(reference, dtype=np.float64)
    cand = np.asarray(candidate, dtype=np.float64)
    if ref.shape != cand.shape:
        raise ValueError(f"shape mismatch: reference {ref.shape} vs candidate {cand.shape}")
    if ref.size == 0:
        return DiffStats(0.0, 0.0, 0.0, 0.0)
    diff = np.abs(ref - cand)
    if not np.all(np.isfinite(diff)):
        nan = float("nan")
        return DiffStats(nan, nan, nan, nan)
    # Relative error floored at 1e-6 of the reference's scale so near-zero entries do not explode.
    floor = max(1e-6 * float(np.max(np.abs(ref))), 1e-12)
    rel = diff / np.maximum(np.abs(ref), floor)
    return DiffStats(max_abs=float(diff.max()), mean_abs=float(diff.mean()),
                     p99_abs=float(np.quantile(diff, 0.99)), max_rel=float(rel.max()))


CALIBRATION_SCALE = 10.0
"""Output magnitude at which the fp32 absolute limits (``max_abs_diff``,
``batch_dependence_max_abs``: 2e-5) were calibrated: the demo's logits."""


def magnitude_factor(reference: np.ndarray) -> float:
    """How much an absolute fp32 limit grows for outputs of this magnitude.

    Two fp32 paths (torch and ONNX Runtime kernels, two batch sizes) differ by a few ulp of
    the values they sum, and an ulp grows with the magnitude: at |logit| ~3e4 one ulp is
    0.004, 200x a limit calibrated at ~10. The factor is
    ``max(1, max|reference| / CALIBRATION_SCALE)``: a limit multiplied by it is unchanged for
    outputs up to that scale and means the same number of ulp above it."""
    ref = np.abs(np.asarray(reference, dtype=np.float64))
    ref = ref[np.isfinite(ref)]
    peak = float(ref.max()) if ref.size else 0.0
    return max(1.0, peak / CALIBRATION_SCALE)


def scaled_note(limits: dict[str, float], factor: float) -> str:
    """The note a check leaves when its limits were scaled by :func:`magnitude_factor`."""
    named = ", ".join(f"{name} {value:.3g}" for name, value in limits.items())
    return (f"limits {named}: scaled by the outputs' magnitude, x{factor:.3g} (max |reference| "
            f"{factor * CALIBRATION_SCALE:.3g} / {CALIBRATION_SCALE:g}), as fp32 rounding grows "
            "with it")  # fmt: skip


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Numerically stable log-softmax over the last axis, in float64."""
    x = np.asarray(logits, dtype=np.float64)
    shifted = x - np.max(x, axis=-1, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))


def distribution_stats(
    reference_logits: np.ndarray, candidate_logits: np.ndarray, top_k: int = 5
) -> DistributionStats:
    """Distances between the categorical action distributions of two (N, A) logit arrays.

    KL is KL(reference || candidate): the cost of acting with the candidate when
    the trainer believes it acts with the reference. Returns kl_mean, kl_max,
    tv_mean, tv_max, topk_overlap (the worst row's fraction of the reference top-k
    found in the candidate top-k), argmax_agreement and ``worst`` (row indices, worst KL first).
    """
    ref = np.asarray(reference_logits, dtype=np.float64)
    cand = np.asarray(candidate_logits, dtype=np.float64)
    ref = ref.reshape(-1, ref.shape[-1])  # (N, A)
    cand = cand.reshape(-1, cand.shape[-1])  # (N, A)
    if not (np.all(np.isfinite(ref)) and np.all(np.isfinite(cand))):
        nan = float("nan")
        return DistributionStats(nan, nan, nan, nan, nan, nan)
    logp_ref = log_softmax(ref)
    logp_cand = log_softmax(cand)
    p_ref = np.exp(logp_ref)
    kl = np.sum(p_ref * (logp_ref - logp_cand), axis=-1).clip(min=0.0)  # (N,)
    tv = 0.5 * np.sum(np.abs(p_ref - np.exp(logp_cand)), axis=-1)  # (N,)
    k = max(1, min(top_k, ref.shape[-1]))
    # Stable sort so ties resolve identically on both sides and across runs.
    top_ref = np.argsort(-ref, axis=-1, kind="stable")[:, :k]
    top_cand = np.argsort(-cand, axis=-1, kind="stable")[:, :k]
    overlap = np.array(
        [len(set(r.tolist()) & set(c.tolist())) / k for r, c in zip(top_ref, top_cand, strict=True)]
    )
    agree = np.argmax(ref, axis=-1) == np.argmax(cand, axis=-1)
    worst = np.argsort(-kl, kind="stable")[: min(5, len(kl))]
    return DistributionStats(
        kl_mean=float(kl.mean()), kl_max=float(kl.max()), tv_mean=float(tv.mean()),
        tv_max=float(tv.max()), topk_overlap=float(overlap.min()),
        argmax_agreement=float(agree.mean()), worst=[int(i) for i in worst],
        kl_per_row=[float(v) for v in kl])


def same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``torch.equal`` where NaN equals NaN at the same position (a NaN weight loaded as
    itself is the same tensor; its NaN is reported once, as NaN)."""
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if torch.equal(a, b):
        return True
    if not a.is_floating_point():
        return False
    nan_a, nan_b = torch.isnan(a), torch.isnan(b)
    return bool(torch.equal(nan_a, nan_b) and torch.equal(a[~nan_a], b[~nan_b]))
