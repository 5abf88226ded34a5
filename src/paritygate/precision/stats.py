"""Streamed error statistics: per-batch accumulators, no activation is kept.

Every accumulator folds one (reference, candidate) tensor pair at a time into
running sums of squares, a running max and a log-spaced histogram of absolute
errors from which the p99 is read. Sums use float32 norms (the reductions
accumulate blockwise; their relative error, ~1e-6, is far below any budget)
and fall back to masked float64 arithmetic only when a tensor holds NaN/Inf or
a square overflows. The histogram has 8 bins per power of two (the float32
exponent and top three mantissa bits) and is filled from a deterministic
strided sample of at most 2^16 values per tensor. Results are deterministic:
the same tensors give the same numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from types import ModuleType

    import torch

NBINS = 1 << 11  # float32 bits 30..20: 8 exponent bits and the top 3 mantissa bits
SAMPLE = 1 << 16


def _torch() -> ModuleType:
    import torch

    return torch


def _sample(values: torch.Tensor) -> torch.Tensor:
    """A deterministic strided sample of a flat tensor, at most ``SAMPLE`` values."""
    step = -(-values.numel() // SAMPLE)
    return values[::step] if step > 1 else values


def _finite(*values: float) -> bool:
    return all(math.isfinite(v) for v in values)


def sum_squares(t: torch.Tensor) -> float:
    """Sum of squares of a tensor, as a float32 norm squared (the sums every comparison folds)."""
    torch = _torch()
    return float(torch.linalg.vector_norm(t.detach().reshape(-1).to(torch.float32))) ** 2


def compare(reference: torch.Tensor, candidate: torch.Tensor, full: bool = True,
            ref2: float | None = None) -> Pair:
    """Sums of squares of the error, reference and candidate of one pair of same-shape tensors;
    with ``full``, also the largest |error|, its histogram and NaN/Inf counts. ``ref2``: the
    reference's sum of squares when already known (one reference meets several candidates)."""
    torch = _torch()
    ref = reference.detach().reshape(-1).to(torch.float32)
    # the error is computed in place in a copy of the candidate: an out-of-place difference
    # costs about three times as much on CPU (a fresh buffer per call)
    cand = candidate.detach().reshape(-1).to(torch.float32, copy=True)
    c2 = sum_squares(cand)
    r2 = sum_squares(ref) if ref2 is None else ref2
    err = cand.sub_(ref)
    e2 = sum_squares(err)
    if not _finite(e2, r2, c2):
        cand = candidate.detach().reshape(-1).to(torch.float32)
        return _compare_masked(ref, cand) if full else Pair(nonfinite=True)
    pair = Pair(ref.numel(), e2, r2, c2)
    if full and ref.numel():
        abs_err = err.abs_()
        pair.max_abs = float(abs_err.amax())
        pair.zeros, pair.hist_lo, pair.hist = _bins(_sample(abs_err))
    return pair


def _compare_masked(ref: torch.Tensor, cand: torch.Tensor) -> Pair:
    """Slow path: count new NaN/Inf, then compare the finite positions in float64."""
    torch = _torch()
    ref_finite = torch.isfinite(ref)
    pair = Pair(nonfinite=True)
    pair.nan = int((torch.isnan(cand) & ~torch.isnan(ref)).sum())
    pair.inf = int((torch.isinf(cand) & ref_finite).sum())
    valid = ref_finite & torch.isfinite(cand)
    ref, cand = ref[valid].double(), cand[valid].double()
    if ref.numel() == 0:
        return pair
    err = cand - ref
    pair.n = ref.numel()
    pair.sum_err2 = float(torch.dot(err, err))
    pair.sum_ref2 = float(torch.dot(ref, ref))
    pair.sum_cand2 = float(torch.dot(cand, cand))
    pair.max_abs = float(err.abs().max())
    pair.zeros, pair.hist_lo, pair.hist = _bins(_sample(err.abs().float()))
    return pair


def _bins(abs_err: torch.Tensor) -> tuple[int, int, np.ndarray | None]:
    """Histogram of |error|: the count in bin 0, the first other bin reached, and the counts
    from it to the last bin reached (bins: float32 bits 30..20, exponent and 3 mantissa bits)."""
    torch = _torch()
    index = abs_err.contiguous().view(torch.int32) >> 20
    counts = torch.bincount(index, minlength=NBINS).numpy()  # numpy: small ops, no dispatch
    reached = np.flatnonzero(counts[1:])
    if not len(reached):
        return int(counts[0]), 0, None
    low, high = int(reached[0]) + 1, int(reached[-1]) + 2
    return int(counts[0]), low, counts[low:high].copy()


@dataclass
class ErrorStats:
    """Running comparison of a candidate tensor stream with a reference stream."""

    n: int = 0
    """Compared elements (finite on both sides)."""
    sum_err2: float = 0.0
    sum_ref2: float = 0.0
    sum_cand2: float = 0.0
    max_abs: float = 0.0
    nan: int = 0
    """Candidate NaN where the reference is not NaN."""
    inf: int = 0
    """Candidate +-Inf where the reference is finite."""
    hist: np.ndarray | None = None
    """Counts of the histogram bins ``hist_lo`` to ``hist_lo + len(hist) - 1``: only the span
    the errors reached is stored (a few hundred bins, not 2048), as a model has many layers."""
    hist_lo: int = 0
    zeros: int = 0
    """Sampled errors in bin 0 (exactly zero, or below float32's normal range)."""

    def update(self, reference: torch.Tensor, candidate: torch.Tensor) -> None:
        """Fold one pair of same-shape tensors into the running statistics."""
        self.fold(compare(reference, candidate))

    def fold(self, pair: ErrorStats) -> None:
        """Fold the statistics of one comparison (:func:`compare`) or of another stream."""
        self.nan += pair.nan
        self.inf += pair.inf
        if pair.n == 0:
            return
        self.n += pair.n
        self.sum_err2 += pair.sum_err2
        self.sum_ref2 += pair.sum_ref2
        self.sum_cand2 += pair.sum_cand2
        self.max_abs = max(self.max_abs, pair.max_abs)
        self.zeros += pair.zeros
        if pair.hist is None:
            return
        if self.hist is None:
            self.hist, self.hist_lo = pair.hist.copy(), pair.hist_lo
            return
        low = min(self.hist_lo, pair.hist_lo)
        high = max(self.hist_lo + len(self.hist), pair.hist_lo + len(pair.hist))
        merged = np.zeros(high - low, dtype=self.hist.dtype)
        for lo, counts in ((self.hist_lo, self.hist), (pair.hist_lo, pair.hist)):
            merged[lo - low : lo - low + len(counts)] += counts
        self.hist, self.hist_lo = merged, low

    def quantile_abs(self, q: float) -> float:
        """Upper edge of the histogram bin holding the q-quantile of |error| (sampled)."""
        total = self.zeros + (int(self.hist.sum()) if self.hist is not None else 0)
        rank = max(math.ceil(q * total), 1)
        if self.hist is None or rank <= self.zeros:
            return 0.0  # zero (or below float32's normal range)
        index = self.hist_lo + int(np.searchsorted(np.cumsum(self.hist), rank - self.zeros))
        exponent, mantissa = divmod(index, 8)
        upper = 2.0 ** (exponent - 127) * (1 + (mantissa + 1) / 8)
        return min(upper, self.max_abs)

    @property
    def rel_l2(self) -> float:
        """||candidate - reference|| / ||reference||; inf when the candidate has new NaN/Inf."""
        if self.nan or self.inf:
            return math.inf
        if self.sum_err2 == 0.0:
            return 0.0
        if self.sum_ref2 == 0.0:
            return math.inf
        return math.sqrt(self.sum_err2 / self.sum_ref2)

    @property
    def cosine(self) -> float:
        """Cosine similarity from the sums of squares: <r, c> = (|r|^2 + |c|^2 - |c-r|^2) / 2."""
        if self.sum_ref2 == 0.0 or self.sum_cand2 == 0.0:
            return 1.0 if self.sum_ref2 == self.sum_cand2 else 0.0
        dot = (self.sum_ref2 + self.sum_cand2 - self.sum_err2) / 2
        return max(-1.0, min(1.0, dot / math.sqrt(self.sum_ref2 * self.sum_cand2)))

    @property
    def sqnr_db(self) -> float | None:
        """10 log10(signal power / error power); None when the error is exactly zero, -inf when
        the candidate has new NaN/Inf (as :attr:`rel_l2` is inf then)."""
        if self.nan or self.inf:
            return -math.inf
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
class Pair(ErrorStats):
    """The statistics of one (reference, candidate) comparison, folded into every
    :class:`ErrorStats` or :class:`RelL2` that compares the same pair."""

    nonfinite: bool = False
    """A sum of squares overflowed or the tensors hold NaN/Inf (the masked path ran)."""


@dataclass
class RelL2:
    """Only the relative L2 error of a stream (a layer's inherited input error)."""

    sum_err2: float = 0.0
    sum_ref2: float = 0.0
    nonfinite: bool = False

    def update(self, reference: torch.Tensor, candidate: torch.Tensor) -> None:
        self.fold(compare(reference, candidate, full=False))

    def fold(self, pair: Pair) -> None:
        """Fold one comparison (:func:`compare`, full or not)."""
        if pair.nonfinite:
            self.nonfinite = True
            return
        self.sum_err2 += pair.sum_err2
        self.sum_ref2 += pair.sum_ref2

    @property
    def rel_l2(self) -> float:
        if self.nonfinite:
            return math.inf
        if self.sum_err2 == 0.0:
            return 0.0
        return math.sqrt(self.sum_err2 / self.sum_ref2) if self.sum_ref2 else math.inf


@dataclass
class ActivationStats:
    """Range of a layer's fp32 activations against each low-precision format.

    The largest magnitude is exact; the underflow fraction (nonzero values
    below the format's smallest normal number) is estimated on the same kind
    of strided sample as the error histogram.
    """

    numel: int = 0
    max_abs: float = 0.0
    sampled: int = 0
    underflow: dict[str, int] = field(default_factory=dict)

    def update(self, reference: torch.Tensor, dtypes: Sequence[str]) -> None:
        """Fold one fp32 output: its largest magnitude, values below each format's normal range."""
        torch = _torch()
        values = reference.detach().reshape(-1).to(torch.float32)
        if values.numel() == 0:
            return
        low, high = torch.aminmax(values)
        peak = max(-float(low), float(high))
        if not math.isfinite(peak):
            values = values[torch.isfinite(values)]
            if values.numel() == 0:
                return
            peak = float(values.abs().max())
        self.numel += values.numel()
        self.max_abs = max(self.max_abs, peak)
        sample = _sample(values).abs()
        self.sampled += sample.numel()
        nonzero = sample > 0
        for name in dtypes:
            tiny = torch.finfo(getattr(torch, name)).tiny
            below = int((nonzero & (sample < tiny)).sum())
            self.underflow[name] = self.underflow.get(name, 0) + below

    def headroom(self, dtype: str) -> float:
        """max |activation| / the dtype's largest finite value (>= 1 overflows)."""
        torch = _torch()
        return self.max_abs / float(torch.finfo(getattr(torch, dtype)).max)

    def underflow_fraction(self, dtype: str) -> float:
        """Fraction of values whose magnitude lies below the dtype's smallest normal number."""
        return self.underflow.get(dtype, 0) / self.sampled if self.sampled else 0.0


def json_number(value: float | int | None) -> float | int | str | None:
    """Numbers for JSON: NaN/Inf become the strings ``"nan"``/``"inf"``/``"-inf"``."""
    if value is None or isinstance(value, (bool, int)):
        return value
    if math.isfinite(value):
        return float(value)
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
