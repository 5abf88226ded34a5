"""The batched delta statistics (a rollout dump's audit) equal the whole-array ones."""

from __future__ import annotations

import math

import numpy as np
import pytest

from paritygate.metrics.logprob import PRECISION_TIERS, delta_stats
from paritygate.metrics.logprob_stream import DeltaAccumulator


def _case(kind: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    rows, width = 37, 23
    infer = -rng.uniform(0.01, 6.0, size=(rows, width))
    lengths = rng.integers(0, width + 1, size=rows)
    mask = np.arange(width)[None, :] < lengths[:, None]
    train = infer + rng.normal(0.0, 1e-4, size=infer.shape)
    if kind == "outliers":
        train[3, 2] += 4.0
        train[20, 0] -= 2.5
    elif kind == "bias":
        train += 0.05
    elif kind == "noise":
        train += rng.normal(0.0, 0.3, size=infer.shape)
    elif kind == "misaligned":
        train = -rng.uniform(0.01, 6.0, size=infer.shape)
    elif kind == "nonfinite":
        train[1, 0] = np.nan
        infer[5, 1] = -np.inf
    elif kind == "ties":
        train = infer + np.round(rng.normal(0.0, 0.02, size=infer.shape), 2)
    return train, infer, mask


def _batched(train: np.ndarray, infer: np.ndarray, mask: np.ndarray, size: int,
             tier: dict[str, float]) -> object:
    acc = DeltaAccumulator(int(mask.sum()), tier=tier)
    ids = [[100 * s + p for p in range(train.shape[1])] for s in range(train.shape[0])]
    for start in range(0, train.shape[0], size):
        part = slice(start, start + size)
        acc.add(train[part], infer[part], mask[part], ids[part])
    return acc.result(token_text=str)


def _close(obtained: object, expected: object) -> bool:
    if isinstance(expected, float) and isinstance(obtained, float):
        if math.isnan(expected):
            return math.isnan(obtained)
        return obtained == pytest.approx(expected, rel=1e-9, abs=1e-13)
    return obtained == expected


@pytest.mark.parametrize("kind", ["clean", "outliers", "bias", "noise", "misaligned",
                                  "nonfinite", "ties", "empty"])
@pytest.mark.parametrize("size", [1, 5, 37])
def test_batches_give_the_whole_array_statistics(kind: str, size: int) -> None:
    train, infer, mask = _case(kind)
    if kind == "empty":
        mask[:] = False
    tier = dict(PRECISION_TIERS["fp32/fp32"])
    expected = delta_stats(train, infer, mask, tier=tier,
                           token_text=lambda s, p: str(100 * s + p))
    obtained = _batched(train, infer, mask, size, tier)
    assert obtained.labels == expected.labels
    assert obtained.diagnosis == expected.diagnosis
    for name, value in expected.as_metrics().items():
        assert _close(obtained.as_metrics()[name], value), name
    for name, value in expected.correction.items():
        assert _close(obtained.correction[name], value), name
    assert repr(obtained.worst) == repr(expected.worst)
    assert repr(obtained.per_sequence) == repr(expected.per_sequence)  # NaN rows too
    # the check's per-token rows: every masked token, its raw delta (NaN where non-finite)
    raw = [{"seq": int(s), "pos": int(p), "delta": float(train[s, p] - infer[s, p])}
           for s, p in zip(*np.nonzero(mask), strict=True)]
    assert repr(obtained.per_token) == repr(raw[:512])
    assert len(obtained.per_bucket) == len(expected.per_bucket)
    for got, want in zip(obtained.per_bucket, expected.per_bucket, strict=True):
        assert {k: _close(got[k], v) for k, v in want.items()} == dict.fromkeys(want, True)


def test_p99_and_bulk_are_exact_order_statistics() -> None:
    """The p99 is numpy's interpolated quantile, not an estimate: the top set holds it."""
    rng = np.random.default_rng(3)
    infer = -rng.uniform(0.01, 6.0, size=(400, 50))
    train = infer + rng.standard_cauchy(size=infer.shape) * 1e-3
    mask = np.ones(infer.shape, bool)
    expected = delta_stats(train, infer, mask)
    obtained = _batched(train, infer, mask, 16, dict(PRECISION_TIERS["fp32/fp32"]))
    assert obtained.delta_p99_abs == expected.delta_p99_abs
    assert obtained.delta_max_abs == expected.delta_max_abs
    assert obtained.labels == expected.labels
