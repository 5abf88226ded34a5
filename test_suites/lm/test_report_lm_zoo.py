"""Reports of the causal-LM fault zoo: each validates against the published schema and
leads with the check that names the fault; the consequences say "see <check>"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from lm_zoo import FAULTS, LM_CHECKS
from rewording import decisions, reworded

from paritygate.report import validate_report, write_reports

ROOT_OVERRIDES: dict[str, str] = {}
"""Faults whose report leads with another check than the first one named in the zoo."""


@pytest.mark.parametrize("fault", [f for f in FAULTS if f.also_fail], ids=lambda f: f.name)
def test_lm_zoo_report_leads_with_root_cause(lm_variants, fault, tmp_path: Path) -> None:
    gate = lm_variants.gate(fault.name)
    results = [lm_variants.evaluate(fault.name, cid) for cid in LM_CHECKS]
    written = write_reports(gate, results, tmp_path)
    data = json.loads((tmp_path / "report.json").read_text(),
                      parse_constant=lambda t: pytest.fail(f"bare {t} in report.json"))
    validate_report(data)
    expected = ROOT_OVERRIDES.get(fault.name, next(iter(fault.causes)))
    assert written.root_cause == expected, data["root_cause"]
    checks = {c["id"]: c for c in data["checks"]}
    for cid in fault.also_fail:
        if cid == expected or checks[cid]["status"] != "fail":
            continue
        assert checks[cid]["consequence_of"] == expected, checks[cid]["message"]
        assert checks[cid]["message"].startswith(f"see {expected}: ")


@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f.name)
def test_reworded_messages_change_no_decision(lm_variants, fault) -> None:
    """Every message reworded: the root cause, each status and each link stay the same."""
    results = [lm_variants.evaluate(fault.name, cid) for cid in LM_CHECKS]
    assert decisions(reworded(results)) == decisions(results)
