"""A regression must exceed the metric's noise: the floor a baseline stores per metric, where
it comes from, and the rule that judges against it (paritygate.regression)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paritygate.errors import InputError
from paritygate.golden import GoldenStore, regression_check
from paritygate.regression import NOISE_FACTOR, NOISE_ZONE, Margin, golden_regression, noise_floor
from paritygate.result import CheckResult, Measurement
from paritygate.verdict import judge


def _measure(value: float, threshold: float, *, name: str = "categorical_max_abs",
             noise: float | None = None, detail: float | None = None) -> Measurement:
    m = Measurement("logprob_impl")
    m.metric(name, value, threshold=threshold, key=True, noise=noise)
    m.metric("shift_agreement", 1.0, bad="lower", threshold=1.0)
    if detail is not None:
        m.metric("layer/blocks.0/err", detail, threshold=threshold, detail=True)
    return m


def _run(store: GoldenStore, m: Measurement, *, blessing: bool = False) -> CheckResult:
    return regression_check(m, store, margin=Margin(), blessing=blessing,
                            probes_sha256=lambda: "p", provenance=lambda: {"checkpoint": "c"},
                            bless_command="paritygate run gate.yaml --update-golden")


@pytest.mark.parametrize(("blessed", "later", "threshold"), [
    (9.5e-7, 1.9e-6, 1e-5),    # logprob_impl categorical_max_abs, checkpoint-2 -> checkpoint-4
    (2.38e-6, 4.77e-6, 2e-5),  # logits_agreement max_abs_diff, another run
    (2.38e-6, 2.38e-7, 2e-5),  # better is never a regression
])
def test_a_clean_checkpoints_float_noise_passes(tmp_path: Path, blessed: float, later: float,
                                               threshold: float) -> None:
    store = GoldenStore(tmp_path / "golden")
    assert _run(store, _measure(blessed, threshold), blessing=True).status == "pass"
    stored = json.loads(store.path("logprob_impl").read_text(encoding="utf-8"))
    floor = stored["noise"]["categorical_max_abs"]
    assert floor["floor"] == blessed and floor["source"].startswith("blessed value")
    assert "shift_agreement" not in stored["noise"]  # an agreement rate: the margin alone
    result = _run(store, _measure(later, threshold))
    assert result.status == "pass", result.message
    # under the old margin alone (0.25 x golden + 0.05 x threshold) the noise failed
    if later > blessed:
        assert golden_regression(_measure(later, threshold).metrics["categorical_max_abs"],
                                 blessed, Margin()) is not None


def test_a_real_drift_inside_the_threshold_still_fails_and_says_why(tmp_path: Path) -> None:
    store = GoldenStore(tmp_path / "golden")
    _run(store, _measure(9.5e-7, 1e-5), blessing=True)
    drift = _measure(8e-6, 1e-5)  # 8x the blessed value, still inside its threshold
    assert not drift.metrics["categorical_max_abs"].breaches()
    result = _run(store, drift)
    assert result.status == "fail"
    assert [r.kind for r in result.reasons] == ["regression"]
    reason = result.reasons[0].message
    assert "categorical_max_abs regressed vs golden: 8e-06 > 9.5e-07" in reason
    assert f"{NOISE_FACTOR:g} x noise floor 9.5e-07" in reason
    assert "blessed value (at most 0.25 x threshold 1e-05)" in reason
    assert store.obtained_path("logprob_impl").is_file()


def test_the_noise_allowance_never_reaches_past_the_threshold() -> None:
    threshold = 1e-5
    top = NOISE_ZONE * threshold  # the largest blessed value with a floor
    metric = _measure(top, threshold).metrics["categorical_max_abs"]
    noise = noise_floor(metric, top)
    assert noise is not None and top + NOISE_FACTOR * noise.floor == pytest.approx(threshold)
    above = _measure(0.5 * threshold, threshold).metrics["categorical_max_abs"]
    assert noise_floor(above, 0.5 * threshold) is None  # a spent budget is not noise


def test_a_metric_using_its_budget_is_judged_by_the_margin_alone(tmp_path: Path) -> None:
    store = GoldenStore(tmp_path / "golden")
    _run(store, _measure(0.5, 1.0), blessing=True)
    assert "categorical_max_abs" not in json.loads(
        store.path("logprob_impl").read_text(encoding="utf-8"))["noise"]
    assert _run(store, _measure(0.65, 1.0)).status == "pass"  # within 0.125 + 0.05
    result = _run(store, _measure(0.7, 1.0))
    assert result.status == "fail" and "no noise floor" in result.reasons[0].message


def test_a_baseline_without_noise_floors_loads_and_gets_the_default(tmp_path: Path) -> None:
    store = GoldenStore(tmp_path / "golden")
    store.directory.mkdir(parents=True)
    store.path("logprob_impl").write_text(json.dumps(
        {"metrics": {"categorical_max_abs": 9.5e-7, "shift_agreement": 1.0},
         "provenance": {"probes_sha256": "p"}}), encoding="utf-8")
    golden = store.load("logprob_impl")
    assert golden is not None and "noise" not in golden
    assert judge(_measure(1.9e-6, 1e-5), golden).status == "pass"
    drift = judge(_measure(8e-6, 1e-5), golden)
    assert drift.status == "fail"
    assert "default for a baseline without noise floors" in drift.reasons[0].message


def test_a_declared_floor_is_stored_and_used(tmp_path: Path) -> None:
    store = GoldenStore(tmp_path / "golden")
    # blessed above the noise zone, but the check measured its own floor (e.g. bf16 rounding)
    _run(store, _measure(0.04, 0.1, noise=0.03), blessing=True)
    floor = json.loads(store.path("logprob_impl").read_text(encoding="utf-8"))["noise"]
    assert floor["categorical_max_abs"] == {"floor": 0.03, "source": "declared by the check"}
    assert _run(store, _measure(0.09, 0.1, noise=0.03)).status == "pass"
    assert _run(store, _measure(0.2, 0.1, noise=0.03)).status == "fail"  # and its threshold


def test_a_floor_the_check_declares_later_applies_to_an_older_baseline(tmp_path: Path) -> None:
    store = GoldenStore(tmp_path / "golden")
    # blessed above the noise zone while the check declared no floor: the margin alone
    _run(store, _measure(0.04, 0.1), blessing=True)
    assert "categorical_max_abs" not in json.loads(
        store.path("logprob_impl").read_text(encoding="utf-8"))["noise"]
    assert _run(store, _measure(0.09, 0.1)).status == "fail"
    # the check now declares rounding's own size: the same move is noise without a re-bless
    later = _run(store, _measure(0.09, 0.1, noise=0.03))
    assert later.status == "pass", later.message
    drift = _run(store, _measure(0.0999, 0.1, noise=0.01))  # beyond 3 declared floors
    assert drift.status == "fail" and "declared by the check" in drift.reasons[0].message


def test_per_item_floors_live_beside_per_item_values(tmp_path: Path) -> None:
    store = GoldenStore(tmp_path / "golden")
    _run(store, _measure(1e-6, 1e-3, detail=1e-5), blessing=True)
    items = json.loads(store.detail_path("logprob_impl").read_text(encoding="utf-8"))
    assert items["noise"]["layer/blocks.0/err"]["floor"] == 1e-5
    head = json.loads(store.path("logprob_impl").read_text(encoding="utf-8"))
    assert "layer/blocks.0/err" not in head["noise"]
    assert _run(store, _measure(1e-6, 1e-3, detail=3e-5)).status == "pass"  # 3x: noise
    jumped = _run(store, _measure(1e-6, 1e-3, detail=2e-4))  # 20x: a layer's error jumped
    assert jumped.status == "fail" and "layer/blocks.0/err" in jumped.failed_metrics


def test_a_malformed_noise_floor_is_bad_input_naming_the_key(tmp_path: Path) -> None:
    store = GoldenStore(tmp_path / "golden")
    store.directory.mkdir(parents=True)
    store.path("logprob_impl").write_text(json.dumps(
        {"metrics": {"categorical_max_abs": 1e-6},
         "noise": {"categorical_max_abs": {"floor": "small"}}}), encoding="utf-8")
    with pytest.raises(InputError) as err:
        store.load("logprob_impl")
    assert err.value.key == "noise.categorical_max_abs"
