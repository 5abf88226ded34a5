"""Streamed error statistics: per-batch accumulators, no activation is kept.

Every accumulator folds one (reference, candidate) tensor pair at a time into
running sums (float64), a running max and a log-spaced histogram of absolute
errors (8 bins per octave, ~9 % wide) from which the p99 is read. Results are
deterministic: the same tensors give the same numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

SUBBINS = 8  # histogram bins per power of two
EXP_MIN = -160  # frexp exponents of float32 values lie in [-148, 128]
EXP_MAX = 130
NBINS = (EXP_MAX - EXP_MIN) * SUBBINS


def _torch() -> Any:
    import torch

    return torch


@dataclass
class ErrorStats:
    """Running comparison of a candidate tensor stream with a reference stream."""

    n: int = 0
    """Compared elements (finite on both sides)."""
    sum_err2: float = 0.0
    sum_ref2: float = 0.0
    sum_cand2: float = 0.0
    sum_dot: float = 0.0
    max_abs: float = 0.0
    nan: int = 0
    """Candidate NaN where the reference is not NaN."""
    inf: int = 0
    """Candidate +-Inf where the reference is finite."""
    zeros: int = 0
    hist: Any = None

    def update(self, reference: Any, candidate: Any) -> None:
        """Fold one pair of same-shape tensors into the running statistics."""
        torch = _torch()
        ref = reference.detach().reshape(-1).to(torch.float32)
        cand = candidate.detach().reshape(-1).to(torch.float32)
        ref_finite = torch.isfinite(ref)
        cand_finite = torch.isfinite(cand)
        self.nan += int((torch.isnan(cand) & ~torch.isnan(ref)).sum())
        self.inf += int((torch.isinf(cand) & ref_finite).sum())
        if not bool(ref_finite.all() and cand_finite.all()):
            valid = ref_finite & cand_finite
            ref, cand = ref[valid], cand[valid]
        if ref.numel() == 0:
            return
        err = cand - ref
        ref64, cand64, err64 = ref.double(), cand.double(), err.double()
        self.n += ref.numel()
        self.sum_err2 += float(torch.dot(err64, err64))
        self.sum_ref2 += float(torch.dot(ref64, ref64))
        self.sum_cand2 += float(torch.dot(cand64, cand64))
        self.sum_dot += float(torch.dot(ref64, cand64))
        abs_err = err.abs()
        self.max_abs = max(self.max_abs, float(abs_err.max()))
        self._histogram(abs_err)

    def _histogram(self, abs_err: Any) -> None:
        torch = _torch()
        nonzero = abs_err[abs_err > 0]
        self.zeros += abs_err.numel() - nonzero.numel()
        if nonzero.numel() == 0:
            return
        mantissa, exponent = torch.frexp(nonzero)  # |e| = m * 2^x, m in [0.5, 1)
        sub = ((mantissa - 0.5) * (2 * SUBBINS)).long().clamp_(0, SUBBINS - 1)
        index = ((exponent.long() - EXP_MIN) * SUBBINS + sub).clamp_(0, NBINS - 1)
        counts = torch.bincount(index, minlength=NBINS)
        self.hist = counts if self.hist is None else self.hist + counts

    def quantile_abs(self, q: float) -> float:
        """Upper edge of the histogram bin holding the q-quantile of |error|."""
        if self.n == 0:
            return 0.0
        rank = math.ceil(q * self.n)
        if rank <= self.zeros or self.hist is None:
            return 0.0
        cumulative = self.hist.cumsum(0)
        index = int((cumulative >= rank - self.zeros).nonzero()[0])
        exponent, sub = divmod(index, SUBBINS)
        upper = (0.5 + (sub + 1) / (2 * SUBBINS)) * 2.0 ** (exponent + EXP_MIN)
        return min(upper, self.max_abs)

    @property
    def rel_l2(self) -> float:
        """||candidate - reference|| / ||reference|| over the compared elements."""
        if self.sum_err2 == 0.0:
            return 0.0
        if self.sum_ref2 == 0.0:
            return math.inf
        return math.sqrt(self.sum_err2 / self.sum_ref2)

    @property
    def cosine(self) -> float:
        if self.sum_ref2 == 0.0 or self.sum_cand2 == 0.0:
            return 1.0 if self.sum_ref2 == self.sum_cand2 else 0.0
        return self.sum_dot / math.sqrt(self.sum_ref2 * self.sum_cand2)

    @property
    def sqnr_db(self) -> float | None:
        """10 log10(signal power / error power); None when the error is exactly zero."""
        if self.sum_err2 == 0.0:
            return None
        if self.sum_ref2 == 0.0:
            return -math.inf
        return 10.0 * math.log10(self.sum_ref2 / self.sum_err2)

    def summary(self, prefix: str) -> dict[str, Any]:
        """Named results, e.g. ``local_rel_l2``, ``local_p99_abs`` for prefix ``local``."""
        return {
            f"{prefix}_rel_l2": self.rel_l2,
            f"{prefix}_max_abs": self.max_abs,
            f"{prefix}_p99_abs": self.quantile_abs(0.99),
            f"{prefix}_cosine": self.cosine,
            f"{prefix}_sqnr_db": self.sqnr_db,
            f"{prefix}_nan": self.nan,
            f"{prefix}_inf": self.inf,
        }


@dataclass
class ActivationStats:
    """Range of a layer's fp32 activations against each low-precision format."""

    numel: int = 0
    max_abs: float = 0.0
    underflow: dict[str, int] = field(default_factory=dict)

    def update(self, reference: Any, dtypes: list[str]) -> None:
        """Fold one fp32 output tensor: its largest magnitude and values below each format's normal range."""
        torch = _torch()
        values = reference.detach().reshape(-1).to(torch.float32).abs()
        values = values[torch.isfinite(values)]
        self.numel += values.numel()
        if values.numel() == 0:
            return
        self.max_abs = max(self.max_abs, float(values.max()))
        for name in dtypes:
            tiny = torch.finfo(getattr(torch, name)).tiny
            below = int(((values > 0) & (values < tiny)).sum())
            self.underflow[name] = self.underflow.get(name, 0) + below

    def headroom(self, dtype: str) -> float:
        """max |activation| / the dtype's largest finite value (>= 1 overflows)."""
        torch = _torch()
        return self.max_abs / float(torch.finfo(getattr(torch, dtype)).max)

    def underflow_fraction(self, dtype: str) -> float:
        """Fraction of values whose magnitude lies below the dtype's smallest normal number."""
        return self.underflow.get(dtype, 0) / self.numel if self.numel else 0.0
