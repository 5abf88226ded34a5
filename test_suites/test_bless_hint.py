"""A missing baseline is bookkeeping, not the fault: the root cause's fix stays the fault's and
the bless hint is its own field (per check and for the run) and its own report line."""

from __future__ import annotations

import pytest

from paritygate.result import Measurement
from paritygate.rootcause import bless_hint, explain
from paritygate.verdict import BLESS_HINT, judge


def _sampling(differs: bool) -> Measurement:
    m = Measurement("sampling_config")
    m.metric("fields_differ", int(differs), bad="higher", threshold=0, key=True)
    if differs:
        m.fail("field_differs", "temperature: training 1.0, serving 0.7", metric="fields_differ")
    return m


def test_a_protocol_roots_fix_does_not_depend_on_a_baseline() -> None:
    blessed = {"metrics": {"fields_differ": 0}, "provenance": {}}
    without, with_golden = judge(_sampling(True), None), judge(_sampling(True), blessed)
    assert without.bless_hint == BLESS_HINT and with_golden.bless_hint is None
    roots = [explain([r])[1] for r in (without, with_golden)]
    assert roots[0] is not None and roots[1] is not None
    assert roots[0].kind == roots[1].kind == "sampling_protocol"
    assert roots[0].finding == roots[1].finding == "field_differs"
    assert roots[0].fix == roots[1].fix
    assert roots[0].fix is not None and "bless" not in roots[0].fix
    assert without.fix is None or "bless" not in without.fix


def test_the_run_says_which_checks_lack_a_baseline_and_how_to_bless() -> None:
    clean = judge(_sampling(False), None)
    clean.bless_hint = "bless with: paritygate run gate.yaml --update-golden"
    assert bless_hint([clean]) == ("1 check(s) have no golden baseline (sampling_config): "
                                   "bless with: paritygate run gate.yaml --update-golden")
    faulty = judge(_sampling(True), None)
    other = judge(Measurement("logits_agreement", skipped=None), None)
    hint = bless_hint([faulty, other])
    # something else fails: no command is offered, only the generic next step
    assert hint == f"2 check(s) have no golden baseline (sampling_config, logits_agreement): " \
                   f"{BLESS_HINT}"
    _, root = explain([faulty])
    assert root is not None and root.kind == "sampling_protocol"
    blessed = judge(_sampling(False), {"metrics": {"fields_differ": 0}})
    assert bless_hint([blessed]) is None
    _, only_missing = explain([clean])
    assert only_missing is not None and only_missing.kind == "no_golden"
    assert only_missing.fix == clean.bless_hint  # a missing baseline is all there is to fix


def test_report_md_and_html_print_the_hint_as_a_line_of_its_own() -> None:
    from paritygate.report.render import report_html, report_markdown

    faulty = judge(_sampling(True), None)
    results, root = explain([faulty])
    assert root is not None
    data = {
        "name": "g", "status": "fail", "counts": {"pass": 0, "fail": 1, "error": 0, "skip": 0,
                                                   "total": 1},
        "checkpoint": {"path": "c", "sha256": "0" * 64}, "git_commit": None,
        "artifact_url": None, "root_cause": root.to_json(), "bless_hint": bless_hint(results),
        "checks": [r.to_json() for r in results], "environment": {}, "family": "causal_lm",
        "config": "gate.yaml", "generated_at": "2026-01-01T00:00:00Z",
    }
    md = report_markdown(data, {})
    assert f"\nNext step: 1 check(s) have no golden baseline (sampling_config): {BLESS_HINT}\n" \
        in md
    fix_line = next(ln for ln in md.splitlines() if ln.startswith("Likely fix:"))
    assert "bless" not in fix_line
    html = report_html(data, {})
    assert "<b>Next step:</b> 1 check(s) have no golden baseline" in html


@pytest.mark.parametrize(("finding", "kind"), [("reference_is_policy", "reference_is_policy"),
                                               ("reference_not_initial", "reference_provenance")])
def test_a_reference_finding_keeps_its_kind_once_a_baseline_exists(finding: str,
                                                                   kind: str) -> None:
    """With a baseline the reference's digest regresses too (reference_drift's edge); the
    finding on this run still names the fault, as it does without a baseline."""
    def measured() -> Measurement:
        m = Measurement("reference_parity")
        m.metric("reference_digest", 7, bad="change")
        m.fail(finding, "the KL reference is not the frozen initial policy")
        return m

    blessed = {"metrics": {"reference_digest": 3}, "provenance": {}}
    with_golden, without = judge(measured(), blessed), judge(measured(), None)
    assert "reference_digest" in with_golden.failed_metrics
    roots = [explain([r])[1] for r in (with_golden, without)]
    assert [(r.kind, r.finding, r.fix) for r in roots if r] == [
        (kind, finding, roots[1].fix if roots[1] else None)] * 2
    drift = Measurement("reference_parity")
    drift.metric("reference_digest", 7, bad="change")
    _, root = explain([judge(drift, blessed)])  # moved between checkpoints, nothing else wrong
    assert root is not None and root.kind == "reference_drift"
