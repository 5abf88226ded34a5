"""batch_invariance on policy artifacts: each fault of :mod:`batch_zoo` fails with its named
kind, each clean twin passes, an artifact that cannot batch is skipped with the reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from batch_zoo import ENTRIES, ENTRIES_BY_ID
from policy_zoo import evaluate_all, fault_config

from paritygate.checks.batch_invariance import KINDS


def _evaluate(clean: Path, tmp_path: Path, entry_id: str) -> Any:
    entry = ENTRIES_BY_ID[entry_id]
    out = tmp_path / entry.id
    config = fault_config(clean, out, entry.build(clean, out))
    return evaluate_all(config, ("batch_invariance",))["batch_invariance"]


@pytest.mark.parametrize("entry_id", [e.id for e in ENTRIES])
def test_batch_zoo_entry(clean_demo: Path, tmp_path: Path, entry_id: str) -> None:
    entry = ENTRIES_BY_ID[entry_id]
    result = _evaluate(clean_demo, tmp_path, entry_id)
    if entry.skip is not None:
        assert result.status == "skip", result.message
        assert entry.skip in result.message
    elif entry.kind is None:
        assert result.status == "pass", result.message
        assert result.metrics["output_max_abs_diff"] <= 2e-5
    else:
        assert entry.kind in KINDS
        assert result.status == "fail", result.message
        assert entry.kind in result.finding_kinds(), result.message


def test_rounding_is_noise_with_its_size(clean_demo: Path, tmp_path: Path) -> None:
    """torch's batch-shaped sums move the .pt2 program's outputs by ulps: a note, not a fail."""
    result = _evaluate(clean_demo, tmp_path, "pt2_clean")
    assert result.status == "pass", result.message
    assert 0 < result.metrics["output_max_abs_diff"] <= 2e-5
    assert result.metrics["bitwise_identical"] is False
    assert any("batch-dependent rounding" in n for n in result.details["notes"])
    assert set(result.details["layouts"]) == {"batched", "pairs", "reversed", "shuffled"}


def test_training_mode_export_is_the_root(clean_demo: Path, tmp_path: Path) -> None:
    """batchnorm_export names the training-mode export; batch_invariance is its consequence."""
    from paritygate.rootcause import explain

    entry = ENTRIES_BY_ID["onnx_bn_training"]
    out = tmp_path / entry.id
    config = fault_config(clean_demo, out, entry.build(clean_demo, out))
    results = list(evaluate_all(config, ("batchnorm_export", "batch_invariance")).values())
    explained, root = explain(results)
    assert root is not None and root.check == "batchnorm_export", root
    assert {r.id: r.consequence_of for r in explained}["batch_invariance"] == "batchnorm_export"


def test_batch_statistics_in_serving_is_the_root(clean_demo: Path, tmp_path: Path) -> None:
    """preprocessing_parity sees serving's inputs differ; batch_invariance names why."""
    from paritygate.rootcause import explain

    entry = ENTRIES_BY_ID["serving_batch_stats"]
    out = tmp_path / entry.id
    config = fault_config(clean_demo, out, entry.build(clean_demo, out))
    results = list(evaluate_all(config, ("preprocessing_parity", "batch_invariance")).values())
    explained, root = explain(results)
    assert root is not None and (root.check, root.kind) == (
        "batch_invariance", "batch_statistics_in_serving"), root
    assert {r.id: r.consequence_of for r in explained}["preprocessing_parity"] == (
        "batch_invariance")
