"""Statistics and diagnosis of trainer-vs-engine log-prob deltas (numpy only)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from paritygate.metrics.logprob import PRECISION_TIERS, DeltaStats, delta_stats, tier_for

METRICS = {
    "delta_mean",
    "delta_std",
    "delta_max_abs",
    "delta_p99_abs",
    "prob_diff_mean",
    "prob_diff_max",
    "k3_kl",
    "ratio_outside_frac",
    "n_tokens",
    "nonfinite_tokens",
}


def _logp(shape: tuple[int, int], seed: int = 0) -> np.ndarray:
    """Plausible sampled-token log-probs in (-6, -0.01)."""
    rng = np.random.default_rng(seed)
    return -rng.uniform(0.01, 6.0, size=shape)


def test_zero_delta_is_all_zero_and_consistent() -> None:
    lp = _logp((4, 50))
    stats = delta_stats(lp, lp.copy(), np.ones(lp.shape, dtype=bool))
    metrics = stats.as_metrics()
    assert set(metrics) == METRICS
    for name in METRICS - {"n_tokens"}:
        assert metrics[name] == 0.0, name
    assert metrics["n_tokens"] == 200
    assert stats.diagnosis.startswith("consistent")
    assert stats.labels == ["consistent"]


def test_constant_shift_is_systematic_bias() -> None:
    lp = _logp((4, 50))
    stats = delta_stats(lp + 0.05, lp, np.ones(lp.shape, dtype=bool))
    assert stats.labels == ["systematic bias"]
    assert "systematic bias" in stats.diagnosis and "trainer higher" in stats.diagnosis
    assert stats.delta_mean == pytest.approx(0.05)
    assert stats.delta_std == pytest.approx(0.0, abs=1e-12)


def test_tiny_shift_within_tier_is_consistent() -> None:
    lp = _logp((4, 50))
    stats = delta_stats(
        lp + 1e-3, lp, np.ones(lp.shape, dtype=bool), tier=PRECISION_TIERS["bf16/bf16"]
    )
    assert stats.labels == ["consistent"]


def test_gaussian_noise_is_noise() -> None:
    rng = np.random.default_rng(1)
    lp = _logp((20, 100))
    stats = delta_stats(lp + rng.normal(0.0, 0.05, lp.shape), lp, np.ones(lp.shape, dtype=bool))
    assert stats.labels == ["noise"]
    assert stats.delta_std == pytest.approx(0.05, rel=0.05)
    assert abs(stats.delta_mean) < 3 * 0.05 / math.sqrt(2000)


def test_one_huge_token_is_an_outlier_and_listed_first() -> None:
    rng = np.random.default_rng(2)
    lp = _logp((8, 40))
    train = lp + rng.normal(0.0, 1e-7, lp.shape)
    train[5, 17] += 3.0
    stats = delta_stats(
        train, lp, np.ones(lp.shape, dtype=bool), token_text=lambda s, p: f"tok[{s},{p}]"
    )
    assert stats.labels == ["outlier tokens"]
    first = stats.worst[0]
    assert (first["seq"], first["pos"], first["text"]) == (5, 17, "tok[5,17]")
    assert first["delta"] == pytest.approx(3.0, abs=1e-5)
    assert first["outlier"] is True
    assert stats.delta_max_abs == pytest.approx(3.0, abs=1e-5)
    assert len(stats.worst) == 5
    assert [row["seq"] for row in stats.per_sequence if row["max_abs"] > 1.0] == [5]


def test_mask_excludes_tokens() -> None:
    lp = _logp((3, 10))
    train = lp.copy()
    train[:, 7:] += 5.0  # garbage in the pad slots
    train[1, 2] = np.nan  # NaN under the mask's zeros does not count
    mask = np.ones(lp.shape, dtype=bool)
    mask[:, 7:] = False
    mask[1, 2] = False
    stats = delta_stats(train, lp, mask)
    assert stats.n_tokens == 3 * 7 - 1
    assert stats.nonfinite_tokens == 0
    assert stats.delta_max_abs == 0.0
    assert stats.labels == ["consistent"]
    assert all(row["pos"] < 7 for row in stats.per_token)


def test_nan_and_inf_are_counted_never_passed() -> None:
    lp = _logp((2, 6))
    infer = lp.copy()
    infer[0, 1] = np.nan
    infer[1, 4] = -np.inf
    stats = delta_stats(lp, infer, np.ones(lp.shape, dtype=bool))
    assert stats.nonfinite_tokens == 2
    assert stats.as_metrics()["nonfinite_tokens"] == 2.0
    assert stats.n_tokens == 10
    assert "non-finite" in stats.labels and "consistent" not in stats.labels
    assert stats.worst[0]["nonfinite"] is True
    assert {(r["seq"], r["pos"]) for r in stats.worst if r["nonfinite"]} == {(0, 1), (1, 4)}


def test_all_nonfinite_gives_nan_metrics() -> None:
    lp = np.full((1, 3), np.nan)
    stats = delta_stats(lp, lp, np.ones((1, 3), dtype=bool))
    assert stats.nonfinite_tokens == 3 and stats.n_tokens == 0
    assert math.isnan(stats.delta_max_abs) and math.isnan(stats.k3_kl)
    assert json.loads(json.dumps(stats.to_details()))["metrics"]["delta_max_abs"] is None


def test_k3_and_prob_diff_match_hand_computation() -> None:
    train = np.array([[math.log(0.5), math.log(0.17), math.log(0.9)]])
    infer = np.array([[math.log(0.4), math.log(0.2), math.log(0.9)]])
    stats = delta_stats(train, infer, np.ones((1, 3), dtype=bool), eps=0.2)
    # r = p_train / p_infer = 1.25, 0.85, 1.0; k3 = mean(r - 1 - log r).
    r = [1.25, 0.85, 1.0]
    k3 = sum(x - 1 - math.log(x) for x in r) / 3
    assert stats.k3_kl == pytest.approx(k3, rel=1e-12)
    assert stats.prob_diff_mean == pytest.approx((0.1 + 0.03 + 0.0) / 3)
    assert stats.prob_diff_max == pytest.approx(0.1)
    # 1.25 is outside [0.8, 1.2]; 0.85 and 1.0 are inside.
    assert stats.ratio_outside_frac == pytest.approx(1 / 3)


def test_per_sequence_and_position_buckets() -> None:
    lp = _logp((2, 8))
    train = lp.copy()
    train[0] += np.arange(8) * 0.01  # delta grows with position
    mask = np.ones(lp.shape, dtype=bool)
    mask[1, 6:] = False
    stats = delta_stats(train, lp, mask, buckets=4)
    assert [row["n_tokens"] for row in stats.per_sequence] == [8, 6]
    assert stats.per_sequence[0]["max_abs"] == pytest.approx(0.07)
    assert stats.per_sequence[1]["max_abs"] == 0.0
    assert sum(b["n_tokens"] for b in stats.per_bucket) == 14
    assert [b["pos_lo"] for b in stats.per_bucket] == sorted(b["pos_lo"] for b in stats.per_bucket)
    assert stats.per_bucket[-1]["max_abs"] == pytest.approx(0.07)
    assert stats.per_bucket[0]["max_abs"] < stats.per_bucket[-1]["max_abs"]


def test_details_are_json_serialisable() -> None:
    lp = _logp((2, 5))
    stats = delta_stats(lp + 0.01, lp, np.ones(lp.shape, dtype=bool), token_text=lambda s, p: "x")
    assert isinstance(stats, DeltaStats)
    details = json.loads(json.dumps(stats.to_details()))
    assert details["diagnosis"] == stats.diagnosis
    assert len(details["per_token"]) == 10
    assert details["metrics"]["n_tokens"] == 10


def test_shape_mismatch_is_an_error() -> None:
    with pytest.raises(ValueError, match="shape mismatch"):
        delta_stats(np.zeros((2, 3)), np.zeros((2, 4)), np.ones((2, 3), dtype=bool))


def test_tiers_are_ordered_and_looked_up() -> None:
    assert set(PRECISION_TIERS) == {"fp32/fp32", "bf16/bf16", "fp16/fp16", "bf16/fp32", "fp16/fp32"}
    keys = {"delta_max_abs", "delta_p99_abs", "delta_mean_abs", "ratio_outside_frac", "k3_kl"}
    for tier in PRECISION_TIERS.values():
        assert set(tier) == keys
    order = ["fp32/fp32", "fp16/fp32", "fp16/fp16", "bf16/fp32", "bf16/bf16"]
    for name in keys - {"ratio_outside_frac"}:
        values = [PRECISION_TIERS[k][name] for k in order]
        assert values == sorted(values), name
    assert tier_for("bfloat16", "torch.bfloat16")[0] == "bf16/bf16"
    assert tier_for("float32", "bf16") == ("bf16/fp32", PRECISION_TIERS["bf16/fp32"])
    assert tier_for("half", "float")[0] == "fp16/fp32"
    with pytest.raises(ValueError, match="no precision tier"):
        tier_for("bf16", "fp16")
    with pytest.raises(ValueError, match="unknown dtype"):
        tier_for("int8", "fp32")


def test_temperature_ratio_is_fitted() -> None:
    from paritygate.metrics.logprob_correction import fit_temperature_ratio

    rng = np.random.default_rng(3)
    z = rng.normal(0.0, 4.0, size=(300, 50))  # (N, V)
    tok = rng.integers(0, 50, size=300)
    scaled = z / 0.8
    logp = scaled - scaled.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    ratio, explained = fit_temperature_ratio(z, tok, logp[np.arange(300), tok], 1.0)
    assert ratio == pytest.approx(0.8, rel=1e-3) and explained > 0.99
    plain = z - z.max(-1, keepdims=True)
    plain -= np.log(np.exp(plain).sum(-1, keepdims=True))
    r1, _ = fit_temperature_ratio(z, tok, plain[np.arange(300), tok], 1.0)
    assert r1 == pytest.approx(1.0, abs=1e-3)


def test_misalignment_is_low_correlation() -> None:
    lp = _logp((10, 60))
    shifted = np.roll(lp, 1, axis=1)
    stats = delta_stats(lp, shifted, np.ones(lp.shape, dtype=bool))
    assert "misalignment" in stats.labels


def test_noise_names_the_tier_it_fits() -> None:
    rng = np.random.default_rng(4)
    lp = _logp((20, 100))
    small = delta_stats(lp + rng.normal(0, 0.02, lp.shape), lp, np.ones(lp.shape, dtype=bool))
    assert small.labels == ["noise"] and "bf16/fp32 precision noise" in small.diagnosis
    big = delta_stats(lp + rng.normal(0, 0.5, lp.shape), lp, np.ones(lp.shape, dtype=bool))
    assert "larger than any precision tier" in big.diagnosis


def test_rollout_correction_formulas() -> None:
    from paritygate.metrics.logprob_correction import rollout_correction

    delta = np.array([0.0, math.log(3.0), 0.0, -math.log(2.0)])
    seq = np.array([0, 0, 1, 1])
    rc = rollout_correction(delta, seq, 2, cap=2.0)
    assert rc["token_ratio_mean"] == pytest.approx((1 + 3 + 1 + 0.5) / 4)
    assert rc["token_outside_frac"] == pytest.approx(0.25)  # 3 > c; 0.5 is on the boundary
    assert rc["seq_ratio_mean"] == pytest.approx((3 + 0.5) / 2)
    assert rc["geo_ratio_mean"] == pytest.approx((math.sqrt(3) + math.sqrt(0.5)) / 2)
    assert rc["ess"] == pytest.approx(3.5**2 / (2 * (9 + 0.25)))
    assert rc["chi2"] == pytest.approx((0 + 4 + 0 + 0.25) / 4)
    assert rc["ppl_ratio"] == pytest.approx(math.exp(-delta.mean()))
    assert rc["catastrophic_frac"] == 0.0
