"""Findings are records: a declared kind per check, and decisions that never read the wording."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from paritygate.check import CheckSpec
from paritygate.checks import CHECK_IDS, get_check
from paritygate.golden import GoldenStore, regression_check
from paritygate.result import COMMON_KINDS, Finding, Measurement
from paritygate.verdict import Margin

CHECKS_DIR = Path(__file__).resolve().parents[1] / "src" / "paritygate" / "checks"


def _literal_kinds(path: Path) -> set[str]:
    """The string-literal kinds a module passes to ``.fail(kind, ...)``."""
    kinds = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "fail" and node.args
                and isinstance(node.args[0], ast.Constant)):
            kinds.add(node.args[0].value)
    return kinds


@pytest.mark.parametrize("check_id", CHECK_IDS)
def test_every_recorded_kind_is_declared(check_id: str) -> None:
    spec = get_check(check_id)
    used = _literal_kinds(CHECKS_DIR / f"{check_id}.py")
    assert used <= set(spec.kinds) | set(COMMON_KINDS), used - set(spec.kinds)


def test_an_undeclared_kind_raises() -> None:
    get_check("weights_load")
    m = Measurement("weights_load")
    m.fail("wrapper_prefix", "checkpoint keys carry the 'module.' prefix")
    assert m.findings == [Finding("wrapper_prefix", "checkpoint keys carry the 'module.' prefix")]
    with pytest.raises(ValueError, match="undeclared finding kind 'prefix_thing'"):
        m.fail("prefix_thing", "anything")


def test_a_spec_declares_snake_case_kinds_once() -> None:
    def measure(ctx: Any, thresholds: Any) -> Measurement:
        return Measurement("x")

    with pytest.raises(ValueError, match="snake_case"):
        CheckSpec("unit_bad_kinds", "", ("policy",), measure, kinds=("Not Snake",))
    with pytest.raises(ValueError, match="twice"):
        CheckSpec("unit_twice", "", ("policy",), measure, kinds=("a", "a"))


def _measurement(text: str) -> Measurement:
    m = Measurement("logits_agreement")
    m.metric("max_abs_diff", 0.5, threshold=1.0, key=True)
    m.metric("kl_max", 0.1, threshold=1.0)
    m.fail("artifact_outputs_differ", text, metric="max_abs_diff")
    return m


def _decide(tmp: Path, text: str, golden: dict[str, Any] | None, **kw: Any) -> dict[str, Any]:
    store = GoldenStore(tmp / str(len(text)))
    if golden is not None:
        store.write("logits_agreement", golden["metrics"], golden["provenance"])
    result = regression_check(
        _measurement(text), store, margin=Margin(), blessing=False,
        probes_sha256=lambda: kw.get("probes", "p" * 64), provenance=lambda: {},
        bless_command="paritygate run gate.yaml --update-golden",
        numerics=lambda: kw.get("numerics", {}),
    )
    return {"status": result.status, "reasons": [(r.kind, r.metric, r.finding)
                                                 for r in result.reasons],
            "fix": result.fix is not None, "obtained": "obtained_path" in result.details,
            "numerics": result.details.get("numerics_changed")}


@pytest.mark.parametrize("case", ["no_golden", "same", "regressed", "probes", "numerics"])
def test_golden_decisions_do_not_read_the_wording(tmp_path: Path, case: str) -> None:
    """A finding whose message says "golden" or "regressed" changes no decision of the golden
    life cycle: what it writes and offers follows the reasons' kinds."""
    blessed = {"metrics": {"max_abs_diff": 0.5, "kl_max": 0.1},
               "provenance": {"probes_sha256": "p" * 64, "numerics": {"dtype": "float32"}}}
    golden = None if case == "no_golden" else blessed
    if case in ("regressed", "numerics"):
        golden = {**blessed, "metrics": {"max_abs_diff": 0.01, "kl_max": 0.1}}
    kw: dict[str, Any] = {}
    if case == "probes":
        kw["probes"] = "q" * 64
    if case == "numerics":
        kw["numerics"] = {"dtype": "bfloat16"}
    plain = _decide(tmp_path, "artifact logits differ", golden, **kw)
    worded = _decide(tmp_path, "no golden baseline; regressed vs golden; changed: golden", golden,
                     **kw)
    assert plain == worded
    kinds = [k for k, _, _ in plain["reasons"]]
    assert kinds[0] == "finding"
    expected = {"no_golden": ["finding", "no_golden"], "same": ["finding"],
                "regressed": ["finding", "regression"], "probes": ["finding", "probe_set_changed"],
                "numerics": ["finding", "regression"]}[case]
    assert kinds == expected
    assert plain["obtained"] == (case != "same")
    assert (plain["numerics"] is not None) == (case == "numerics")
