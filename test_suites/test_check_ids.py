"""A check id is written in five places; this keeps them in agreement."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from paritygate.checks import CHECK_IDS, get_check

REPO = Path(__file__).resolve().parents[1]
CHECKS = REPO / "src" / "paritygate" / "checks"
GATES = REPO / "gates"


def _measurement_literals(path: Path) -> set[str]:
    """String literals passed as the id of a ``Measurement(...)`` in a module."""
    return {
        node.args[0].value
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        and node.func.id == "Measurement" and node.args
        and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
    }


def test_every_check_module_is_registered_and_has_a_gate_file() -> None:
    modules = {p.stem for p in CHECKS.glob("*.py") if not p.stem.startswith("_")}
    gates = {p.stem.removeprefix("test_") for p in GATES.glob("test_*.py")}
    assert modules == set(CHECK_IDS), modules ^ set(CHECK_IDS)
    assert gates == set(CHECK_IDS), gates ^ set(CHECK_IDS)


@pytest.mark.parametrize("check_id", CHECK_IDS)
def test_one_id_in_module_spec_measurements_and_gate_file(check_id: str) -> None:
    assert get_check(check_id).id == check_id
    assert _measurement_literals(CHECKS / f"{check_id}.py") <= {check_id}
    gate = (GATES / f"test_{check_id}.py").read_text(encoding="utf-8")
    assert re.findall(r'gate_check\("([a-z_]+)"\)', gate) == [check_id]
    assert re.search(rf"def test_{check_id}\(", gate)
