"""A threshold the user tightened is judged as a threshold, never as a named cause.

The fault: ``thresholds.logits_agreement.max_abs_diff`` set below what the clean demo has always
measured (fp32 torch vs ONNX Runtime, ~2e-6), after a clean baseline was blessed. Its twin: a
threshold tightened below the default but above what the model measures, which passes. The
root cause of the fault is the verdict's ``threshold_breach`` (no finding), and the likely fix
names the one key the user set, a key the README documents, never a derived metric's name.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from policy_zoo import base_config

from paritygate.gate import Gate
from paritygate.load import config_from_dict
from paritygate.rootcause import explain

CHECK = "logits_agreement"


def _gate(clean: Path, root: Path, thresholds: dict[str, Any] | None, **kw: Any) -> Gate:
    data = copy.deepcopy(base_config(clean))
    data["name"] = "zoo-tightened"
    data["golden"] = {"dir": str(root / "golden")}
    if thresholds is not None:
        data["thresholds"] = {CHECK: thresholds}
    return Gate(config_from_dict(data, root / "gate.yaml"), **kw)


def test_tightened_threshold_is_a_plain_breach(clean_demo: Path, tmp_path: Path) -> None:
    blessed = _gate(clean_demo, tmp_path, None, update_golden=True).evaluate(CHECK)
    assert blessed.status == "pass", blessed.message
    measured = float(blessed.metrics["max_abs_diff"])
    assert 0 < measured < 2e-5

    result = _gate(clean_demo, tmp_path, {"max_abs_diff": measured / 10}).evaluate(CHECK)
    assert result.status == "fail", result.message
    assert result.finding_kinds() == [], result.reasons  # no cause asserted
    assert {r.kind for r in result.reasons} == {"breach"}
    assert "tightened below what this model has always measured" in result.message
    assert "stale artifact" not in result.message
    assert result.fix == ("loosen thresholds.logits_agreement.max_abs_diff or fix the model, "
                          "then re-bless")  # once, though p99_abs_diff is bounded by it too
    _, root = explain([result])
    assert root is not None and (root.kind, root.finding) == ("threshold_breach", None)

    # without a baseline the breach is still a plain one; its usual causes are only text
    alone = _gate(clean_demo, tmp_path, {"max_abs_diff": measured / 10}).evaluate(
        CHECK, golden=False)
    assert alone.status == "fail" and alone.finding_kinds() == []
    _, root = explain([alone])
    assert root is not None and root.kind == "threshold_breach"


def test_tightened_threshold_the_model_meets_passes(clean_demo: Path, tmp_path: Path) -> None:
    _gate(clean_demo, tmp_path, None, update_golden=True).evaluate(CHECK)
    result = _gate(clean_demo, tmp_path, {"max_abs_diff": 1e-5, "kl_max": 1e-8}).evaluate(CHECK)
    assert result.status == "pass", result.message
    assert result.thresholds["max_abs_diff"] == 1e-5


def test_a_derived_limit_follows_its_key_to_null(clean_demo: Path, tmp_path: Path) -> None:
    """``p99_abs_diff`` is bounded by ``max_abs_diff``: setting that key to ``null`` makes both
    informational."""
    result = _gate(clean_demo, tmp_path, {"max_abs_diff": None}).evaluate(CHECK, golden=False)
    assert "max_abs_diff" not in result.thresholds and "p99_abs_diff" not in result.thresholds
