"""The Dict-observation and recurrent fault zoo: every clean variant passes every check it runs;
each fault fails its check with its finding kind and cause named, and the other checks that fail
are the registry's ``also_fails`` (measured)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from policy_zoo import (
    CLEAN_SHAPES,
    SHAPE_FAULTS,
    SHAPE_FAULTS_BY_ID,
    SUBJECTS,
    evaluate_all,
    failing,
    fault_config,
)


class ShapeZoo:
    """Builds each subject once (``build_once``), each variant once, caches the verdicts."""

    def __init__(self, build_once: Any, root: Path) -> None:
        self.build_once = build_once
        self.root = root
        self._results: dict[str, dict[str, Any]] = {}

    def clean(self, subject: str) -> Path:
        build = SUBJECTS[subject].build
        return self.build_once(f"shape-{subject}", lambda out: build(out / subject)) / subject

    def results(self, entry_id: str) -> dict[str, Any]:
        if entry_id not in self._results:
            entry: Any = SHAPE_FAULTS_BY_ID.get(entry_id) or next(
                c for c in CLEAN_SHAPES if c.id == entry_id)
            clean = self.clean(entry.base)
            out = self.root / entry_id
            config = fault_config(clean, out, entry.build(clean, out), entry.base)
            self._results[entry_id] = evaluate_all(config, SUBJECTS[entry.base].checks)
        return self._results[entry_id]


@pytest.fixture(scope="module")
def shape_zoo(build_once: Any, tmp_path_factory: pytest.TempPathFactory) -> ShapeZoo:
    return ShapeZoo(build_once, tmp_path_factory.mktemp("shape-zoo"))


def test_registry_is_well_formed() -> None:
    assert len({f.id for f in SHAPE_FAULTS}) == len(SHAPE_FAULTS)
    for fault in SHAPE_FAULTS:
        checks = SUBJECTS[fault.base].checks
        assert fault.check in checks and fault.kind and fault.causes
        assert set(fault.also_fails) <= set(checks) - {fault.check}
    from paritygate.checks import get_check

    kinds = get_check("recurrent_parity").kinds
    named = {f.kind for f in SHAPE_FAULTS if f.check == "recurrent_parity"}
    assert {"wrong_initial_state", "missing_reset", "state_swapped", "state_shape"} <= named
    assert named <= set(kinds)


@pytest.mark.parametrize("clean", CLEAN_SHAPES, ids=lambda c: c.id)
def test_clean_variant_passes_every_check(shape_zoo: ShapeZoo, clean: Any) -> None:
    results = shape_zoo.results(clean.id)
    checks = SUBJECTS[clean.base].checks
    expected = dict.fromkeys(checks, "pass")
    if clean.base == "recurrent":
        expected["preprocessing_parity"] = "skip"  # the LSTM demo has no preprocessing
    assert {cid: r.status for cid, r in results.items()} == expected, {
        cid: r.message for cid, r in results.items() if r.status not in ("pass", "skip")}


@pytest.mark.parametrize("fault", SHAPE_FAULTS, ids=lambda f: f.id)
def test_fault_fails_with_its_kind_and_cause(shape_zoo: ShapeZoo, fault: Any) -> None:
    results = shape_zoo.results(fault.id)
    result = results[fault.check]
    assert result.status == "fail", f"{fault.check} {result.status}: {result.message}"
    assert fault.kind in result.finding_kinds(), result.finding_kinds()
    for cause in fault.causes:
        assert cause in result.message, f"{cause!r} not in: {result.message}"
    for wrong in fault.absent:
        assert wrong not in result.message, f"{wrong!r} in: {result.message}"
    crashed = {cid: r.message for cid, r in results.items() if r.status == "error"}
    assert not crashed, crashed
    others = failing(results) - {fault.check}
    assert others == set(fault.also_fails), {cid: results[cid].message[:200] for cid in others}
