"""Reports of the policy fault zoo: each validates against the published schema, leads with
the check whose finding explains the others, and the consequences say "see <check>"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from policy_zoo import FAULTS
from rewording import decisions, reworded

from paritygate.gate import Gate
from paritygate.report import validate_report, write_reports

ROOT_OVERRIDES = {
    # The zoo names the check that must catch the fault; the report's root cause is the
    # finding that explains the others: the manifest proves the artifact is stale.
    "stale_artifact_1e-4": "export_integrity",
    # head_removal must name the randomness itself, but dropout_off's finding explains it.
    "dropout_in_serving_forward": "dropout_off",
    # rollout_parity shows what the fault does to the episodes; the check that names the
    # cause on the probes explains its diverging (or NaN) actions.
    "rollout_stale_velocity_stats": "preprocessing_parity",
    "rollout_action_bias": "logits_agreement",
    "rollout_nan_serving_input": "preprocessing_parity",
}


def _params() -> list[object]:
    return [pytest.param(f, id=f.id, marks=pytest.mark.xdist_group(f.id)) for f in FAULTS]


@pytest.mark.parametrize("fault", _params())
def test_zoo_report_leads_with_root_cause(zoo, fault, tmp_path: Path) -> None:
    results = zoo.results(fault.id)
    gate = Gate(zoo.configs[fault.id])
    written = write_reports(gate, [results[c] for c in fault.checks], tmp_path,
                            formats=frozenset({"json", "md", "html", "junit"}))
    data = json.loads((tmp_path / "report.json").read_text(),
                      parse_constant=lambda t: pytest.fail(f"bare {t} in report.json"))
    validate_report(data)
    expected = ROOT_OVERRIDES.get(fault.id, fault.check)
    assert written.root_cause == expected, data["root_cause"]
    checks = {c["id"]: c for c in data["checks"]}
    for cid in fault.linked:  # pinned: the root's finding explains what these measured
        assert checks[cid]["consequence_of"] == expected, (cid, checks[cid]["message"])
    for cid in set(fault.also_fails) - {expected}:
        if checks[cid]["consequence_of"] is None:
            continue  # an independent finding of the same fault keeps its own message
        assert checks[cid]["consequence_of"] == expected
        assert checks[cid]["message"].startswith(f"see {expected}: ")
    html = (tmp_path / "report.html").read_text()
    assert html.index(f"Root cause: <a href=\"#{expected}\">") < html.index("<table>")


@pytest.mark.parametrize("fault", _params())
def test_reworded_messages_change_no_decision(zoo, fault) -> None:
    """Every message reworded: the root cause, each status and each link stay the same (the
    graph reads finding kinds and measured values, never text)."""
    results = [zoo.results(fault.id)[c] for c in fault.checks]
    assert decisions(reworded(results)) == decisions(results)
