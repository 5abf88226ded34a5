"""One rule for a declared precision's limits (``paritygate.metrics.tiers.judged_limits``):
the config's value wins, else the tier's, else the fp32 default; each limit names its source."""

from __future__ import annotations

import pytest

from paritygate.metrics.tiers import (
    judged_limits,
    logits_thresholds,
    resolve_tier,
    tier_for,
    tier_limits,
)

FP32 = {"near_tie_margin": 1e-3, "max_abs_diff": 2e-5, "kl_max": 1e-6, "own_limit": 7.0}


def test_the_tier_replaces_defaults_and_names_itself() -> None:
    limits = judged_limits(tier_for("float32", "bfloat16"), FP32,
                           declared_by="causal_lm.serving.dtype bfloat16")
    table = tier_limits(tier_for("float32", "bfloat16")[1])
    assert limits.tier == "bf16/fp32"
    assert limits["near_tie_margin"] == table["near_tie_margin"] == table["max_abs_diff"]
    assert limits["kl_max"] == logits_thresholds(tier_for("float32", "bfloat16")[1])["kl_max"]
    assert limits["own_limit"] == 7.0 and limits.sources["own_limit"] == "default"
    assert limits.describe("near_tie_margin") == "0.354 (bf16/fp32 tier; default 0.001 for fp32)"
    note = limits.note(["near_tie_margin"])
    assert note is not None and note.startswith(
        "limits from the bf16/fp32 precision tier (causal_lm.serving.dtype bfloat16")


def test_a_value_set_in_the_config_wins_over_the_tier() -> None:
    limits = judged_limits(tier_for("float16", "float32"), {**FP32, "near_tie_margin": 0.5},
                           {"near_tie_margin"})
    assert limits["near_tie_margin"] == 0.5
    assert limits.describe("near_tie_margin") == "0.5 (set in the config)"
    assert limits["max_abs_diff"] == pytest.approx(0.5 / 8 / 2**0.5)
    assert "set in the config, so not from the tier: near_tie_margin 0.5" in str(limits.note())


@pytest.mark.parametrize("tier", [None, ("fp32/fp32", tier_for("float32", "float32")[1])])
def test_fp32_keeps_the_defaults_and_says_nothing(
    tier: tuple[str, dict[str, float]] | None,
) -> None:
    limits = judged_limits(tier, FP32)
    assert dict(limits) == FP32 and limits.tier is None and limits.note() is None
    assert limits.describe("near_tie_margin") == "0.001"


def test_names_and_aliases_pick_what_the_tier_replaces() -> None:
    limits = judged_limits(tier_for("float32", "float16"), {"eval_max_abs_diff": 1e-5, "kl_max": 1},
                           names=["eval_max_abs_diff"],
                           aliases={"eval_max_abs_diff": "max_abs_diff"})
    assert limits["eval_max_abs_diff"] == pytest.approx(0.5 / 8 / 2**0.5)
    assert limits["kl_max"] == 1 and limits.sources["kl_max"] == "default"


def test_a_pinned_tier_wins_and_an_unknown_one_is_an_error() -> None:
    assert resolve_tier("bf16/bf16", "float32", "float32")[0] == "bf16/bf16"
    assert resolve_tier(None, "float32", "bfloat16")[0] == "bf16/fp32"
    with pytest.raises(ValueError, match="unknown precision tier"):
        resolve_tier("int8/fp32", "float32", "float32")
