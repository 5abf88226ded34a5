"""Streamed statistics against direct numpy computation; budget formula and overrides."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from paritygate.precision.budgets import local_budget, output_budget, unit_roundoff
from paritygate.precision.config import PrecisionSpec
from paritygate.precision.stats import ActivationStats, ErrorStats, RelL2, compare


def test_error_stats_match_direct_computation_over_batches() -> None:
    generator = torch.Generator().manual_seed(0)
    refs = [torch.randn(64, 33, generator=generator) * 3 for _ in range(3)]
    cands = [r + 1e-3 * torch.randn(r.shape, generator=generator) for r in refs]
    stats = ErrorStats()
    for r, c in zip(refs, cands, strict=True):
        stats.update(r, c)
    ref = torch.cat([r.reshape(-1) for r in refs]).double().numpy()
    cand = torch.cat([c.reshape(-1) for c in cands]).double().numpy()
    err = np.abs(cand - ref)
    assert stats.rel_l2 == pytest.approx(np.linalg.norm(cand - ref) / np.linalg.norm(ref), rel=1e-5)
    assert stats.max_abs == pytest.approx(err.max(), rel=1e-6)
    cosine = ref @ cand / (np.linalg.norm(ref) * np.linalg.norm(cand))
    assert stats.cosine == pytest.approx(cosine, rel=1e-9)
    assert stats.sqnr_db == pytest.approx(-20 * math.log10(stats.rel_l2), rel=1e-9)
    p99 = np.quantile(err, 0.99)
    # histogram bins are 2^(1/8) wide: the reported upper edge lies within one bin of the truth
    assert p99 <= stats.quantile_abs(0.99) <= p99 * 2 ** (2 / 8)


def test_histogram_keeps_only_the_span_reached_and_counts_exact_zeros_apart() -> None:
    generator = torch.Generator().manual_seed(1)
    ref = torch.randn(4096, generator=generator)
    cand = ref + 1e-3 * torch.randn(4096, generator=generator)
    cand[:2048] = ref[:2048]  # half the errors exactly zero: bin 0, not part of the span
    stats = ErrorStats()
    stats.update(ref, cand)
    stats.update(ref * 2, cand * 2)  # a second span, one octave up: merged
    assert stats.zeros == 2 * 2048
    assert stats.hist is not None and len(stats.hist) < 200  # of 2048 possible bins
    err = np.abs(np.concatenate([(cand - ref).numpy(), (2 * cand - 2 * ref).numpy()]))
    for q in (0.4, 0.75, 0.99):  # below the zeros' share the quantile is zero
        truth = np.quantile(err, q)
        got = stats.quantile_abs(q)
        assert (got == 0.0) if truth == 0.0 else truth <= got <= truth * 2 ** (2 / 8)


def test_one_comparison_folds_into_several_accumulators_like_separate_updates() -> None:
    generator = torch.Generator().manual_seed(2)
    ref = torch.randn(300, generator=generator)
    cand = (ref + 1e-2 * torch.randn(300, generator=generator)).half()
    pair = compare(ref, cand)
    folded, updated, light = ErrorStats(), ErrorStats(), RelL2()
    folded.fold(pair)
    folded.fold(pair)
    updated.update(ref, cand)
    updated.update(ref, cand)
    light.fold(pair)
    assert (folded.n, folded.sum_err2, folded.max_abs) == (updated.n, updated.sum_err2,
                                                           updated.max_abs)  # fmt: skip
    assert folded.quantile_abs(0.99) == updated.quantile_abs(0.99)
    assert light.rel_l2 == pytest.approx(updated.rel_l2)
    assert compare(ref, cand, full=False).hist is None  # sums only, no histogram


def test_new_nonfinite_values_are_counted_and_make_the_error_infinite() -> None:
    ref = torch.tensor([1.0, 2.0, float("inf"), 4.0])
    cand = torch.tensor([1.0, float("nan"), float("inf"), float("inf")])
    stats = ErrorStats()
    stats.update(ref, cand)
    assert (stats.nan, stats.inf) == (1, 1)
    assert math.isinf(stats.rel_l2)


def test_activation_range_headroom_and_underflow() -> None:
    stats = ActivationStats()
    stats.update(torch.tensor([0.0, 1e-6, 3.0e4, -1.0]), ["float16", "bfloat16"])
    assert stats.headroom("float16") == pytest.approx(3.0e4 / 65504)
    assert stats.underflow_fraction("float16") == pytest.approx(0.25)  # 1e-6 < 6.1e-5
    assert stats.underflow_fraction("bfloat16") == 0.0


def test_budget_formula_and_glob_overrides() -> None:
    assert unit_roundoff("float16") == 2.0**-11
    assert unit_roundoff("bfloat16") == 2.0**-8
    overrides = {"blocks.*.up": 32.0, "float16/head": 64.0}
    assert local_budget("inp", "float16", 16, overrides) == 16 * 2.0**-11
    assert local_budget("blocks.2.up", "bfloat16", 16, overrides) == 32 * 2.0**-8
    assert local_budget("head", "float16", 16, overrides) == 64 * 2.0**-11
    assert local_budget("head", "bfloat16", 16, overrides) == 16 * 2.0**-8
    assert output_budget("float16", 8, 16) == pytest.approx(8 * 2.0**-11 * 4)


def test_precision_spec_is_strict() -> None:
    with pytest.raises(ValidationError):
        PrecisionSpec(dtypes=["float8"])
    with pytest.raises(ValidationError):
        PrecisionSpec(budgets={"x": 0.0})
    with pytest.raises(ValidationError):
        PrecisionSpec(unknown=1)


def test_a_candidate_with_new_inf_has_infinite_error_and_no_signal_to_noise() -> None:
    """rel L2 and SQNR tell the same story: a new Inf is infinite noise, not 69 dB."""
    ref = torch.linspace(-1, 1, 1000)
    cand = ref.clone()
    cand[::100] += 1e-3
    cand[7] = math.inf
    stats = ErrorStats()
    stats.update(ref, cand)
    assert stats.inf == 1 and stats.rel_l2 == math.inf
    assert stats.sqnr_db == -math.inf
