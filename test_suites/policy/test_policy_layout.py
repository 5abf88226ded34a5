"""The policy family's layout: helpers take explicit inputs (none imports the context, no
import circle, type-only imports counted), small modules, records across module boundaries,
and one rule for a precision tier's thresholds."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import numpy as np
import pytest

POLICY = Path(__file__).resolve().parents[2] / "src" / "paritygate" / "families" / "policy"
PACKAGE = "paritygate.families.policy"


def _graph():  # type: ignore[no-untyped-def]
    grimp = pytest.importorskip("grimp")
    return grimp.build_graph("paritygate", exclude_type_checking_imports=False)


def test_policy_family_has_no_import_circle_type_only_imports_counted() -> None:
    graph = _graph()
    mods = sorted(m for m in graph.modules if m.startswith(PACKAGE + "."))
    circles = [(a, b) for a in mods for b in graph.find_modules_directly_imported_by(a)
               if b.startswith(PACKAGE + ".") and graph.chain_exists(importer=b, imported=a)]
    assert circles == []


def test_policy_helpers_do_not_import_their_caller() -> None:
    graph = _graph()
    composers = {f"{PACKAGE}.context", f"{PACKAGE}.build", PACKAGE}
    wrong = sorted(m for m in graph.modules if m.startswith(PACKAGE + ".")
                   and m not in composers
                   and f"{PACKAGE}.context" in graph.find_modules_directly_imported_by(m))
    assert wrong == []


def test_policy_modules_and_functions_are_small() -> None:
    big, long = [], []
    for path in sorted(POLICY.glob("*.py")):
        text = path.read_text(encoding="utf-8")
        if len(text.splitlines()) > 450:
            big.append(path.name)
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                if node.end_lineno - node.lineno + 1 > 100:
                    long.append(f"{path.name}:{node.name}")
    assert big == [] and long == []


def test_initializer_match_is_a_frozen_record_that_names_a_drift() -> None:
    torch = pytest.importorskip("torch")
    from paritygate.families.policy.initializers import InitializerMatch, match_initializers

    weight = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    state = {"net.weight": weight}
    clean = match_initializers([("net.weight", weight.numpy().copy(), None)], state)
    assert isinstance(clean, InitializerMatch)
    assert (clean.comparable, clean.matched, clean.unmatched, clean.drifted) == (1, 1, [], [])
    nudged = weight.numpy().copy()
    nudged[0, 0] += 0.5  # one value off: not a per-channel scale (a folded BatchNorm)
    drifted = match_initializers([("net.weight", nudged, None)], state)
    assert (drifted.matched, drifted.folded, drifted.drifted) == (0, 0, ["net.weight"])
    assert drifted.max_rel_drift == pytest.approx(0.5 / 5.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        clean.matched = 0  # type: ignore[misc]


def test_one_tier_rule_config_wins_and_the_tier_replaces_defaults() -> None:
    from paritygate.families.policy.export import ArtifactPrecision, artifact_limits
    from paritygate.metrics.tiers import tier_for, tier_limits

    defaults = {"max_abs_diff": 1e-4, "kl_max": 1e-6, "tv_max": 1e-4,
                "argmax_disagreement": 0.0, "topk_overlap_min": None}
    half = ArtifactPrecision("float16", {"float16": 4}, 4)
    limits, note = artifact_limits(half, defaults, ["max_abs_diff"], {"kl_max"})
    tier = tier_limits(tier_for("float32", "float16")[1])
    assert limits["max_abs_diff"] == tier["max_abs_diff"] != defaults["max_abs_diff"]
    assert limits["tv_max"] == tier["tv_max"]
    assert limits["kl_max"] == defaults["kl_max"]  # set in the config: kept
    assert note is not None and "set in the config" in note and "kl_max" in note
    fp32 = ArtifactPrecision("float32", {}, 4)
    assert artifact_limits(fp32, defaults, ["max_abs_diff"]) == (defaults, None)


def test_step_diagnosis_is_a_frozen_record() -> None:
    from paritygate.families.policy.rollout import StepDiagnosis

    where = StepDiagnosis(input_max_abs_diff=0.5, worst_input="obs", output_max_abs_diff=0.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        where.worst_input = "x"  # type: ignore[misc]
    assert np.isfinite(where.input_max_abs_diff)
