"""Threshold keys come from one place, each check's declared defaults: README's table documents
every one of them with its default, and a likely fix names no other key."""

from __future__ import annotations

import re
from pathlib import Path

from paritygate.checks import CHECK_IDS, get_check
from paritygate.result import Measurement
from paritygate.verdict import judge, threshold_keys

DOCS = Path(__file__).resolve().parents[1] / "docs"
README = DOCS / "policy" / "thresholds.md"  # the default-threshold table
REPORT = DOCS / "report.md"  # the root_cause.kind table
TABLE = "# Default thresholds and where they come from"


def readme_thresholds() -> dict[tuple[str, str], str]:
    """``(check, key) -> default`` from README's threshold table (a row's empty check cell
    continues the check above it; a cell may name several checks)."""
    text = README.read_text(encoding="utf-8")
    lines = text[text.index(TABLE):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| check | metric |"))
    rows: dict[tuple[str, str], str] = {}
    checks: list[str] = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        checks = re.findall(r"`([a-z_]+)`", cells[0]) or checks
        key = cells[1].strip("`")
        for check in checks:
            rows[(check, key)] = cells[2]
    return rows


def test_readme_documents_every_threshold_key_with_its_default() -> None:
    documented = readme_thresholds()
    declared = {(cid, key): value for cid in CHECK_IDS
                for key, value in get_check(cid).defaults.items()}
    missing = sorted(set(declared) - set(documented))
    assert not missing, f"threshold keys missing from README's table: {missing}"
    stale = sorted(set(documented) - set(declared))
    assert not stale, f"README's table lists keys no check declares: {stale}"
    wrong = {k: (documented[k], v) for k, v in declared.items() if float(documented[k]) != v}
    assert not wrong, f"README defaults differ from the code's: {wrong}"
    for cid in CHECK_IDS:
        assert threshold_keys(cid) == frozenset(get_check(cid).defaults)


def _tightened(check_id: str, name: str, limit_key: str | None) -> str | None:
    """The likely fix when ``name``'s threshold is below its blessed golden value."""
    m = Measurement(check_id)
    m.metric(name, 3e-6, threshold=1e-6, limit_key=limit_key)
    return judge(m, {"metrics": {name: 3e-6}}).fix


def test_a_likely_fix_names_only_declared_keys() -> None:
    assert _tightened("logits_agreement", "p99_abs_diff", "max_abs_diff") == (
        "loosen thresholds.logits_agreement.max_abs_diff or fix the model, then re-bless")
    assert _tightened("dropout_off", "torch_repeat_max_abs_diff", "repeat_max_abs_diff") == (
        "loosen thresholds.dropout_off.repeat_max_abs_diff or fix the model, then re-bless")
    # a limit derived from other settings (a per-layer budget) names no config key
    fix = _tightened("precision_per_layer", "float16/output_rel_l2", None)
    assert fix is not None and "thresholds." not in fix and "float16/output_rel_l2" in fix
    # both metrics bounded by one key: the key once
    m = Measurement("logits_agreement")
    m.metric("max_abs_diff", 3e-6, threshold=1e-6)
    m.metric("p99_abs_diff", 2e-6, threshold=1e-6, limit_key="max_abs_diff")
    fix = judge(m, {"metrics": {"max_abs_diff": 3e-6, "p99_abs_diff": 2e-6}}).fix
    assert fix == "loosen thresholds.logits_agreement.max_abs_diff or fix the model, then re-bless"


def test_readme_lists_every_root_cause_kind() -> None:
    """Scripts act on ``root_cause.kind``: each one the graph or the fallback can give is in
    README's table (or the sentence after it)."""
    from paritygate.rootcause import GRAPH

    text = REPORT.read_text(encoding="utf-8")
    section = text[text.index("| `root_cause.kind` | root check |"):text.index("**Reasons.**")]
    kinds = {e.kind for e in GRAPH} | {"threshold_breach", "independent", "no_golden"}
    assert not sorted(k for k in kinds if f"`{k}`" not in section)
