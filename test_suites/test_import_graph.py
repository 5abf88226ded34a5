"""House rules of ``src/``, measured: no import cycles (type-only imports count), no module
over 450 lines, no function over 100 lines, and a budget for the ``Any`` token."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import grimp

SRC = Path(__file__).resolve().parents[1] / "src" / "paritygate"
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 100
ANY_BUDGET = 359


def _sources() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def test_no_import_cycles() -> None:
    graph = grimp.build_graph("paritygate", exclude_type_checking_imports=False)
    chains: dict[frozenset[str], tuple[str, ...]] = {}
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back is not None:
                chains.setdefault(frozenset(back), (importer, *back))
    listed = "\n".join(" -> ".join(chain) for chain in chains.values())
    assert not chains, f"import cycles in src/ (type-only imports count):\n{listed}"


def test_no_module_over_450_lines() -> None:
    long = {
        str(p.relative_to(SRC)): n
        for p in _sources()
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_no_function_over_100_lines() -> None:
    long: dict[str, int] = {}
    for p in _sources():
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                n = (node.end_lineno or node.lineno) - start + 1
                if n > MAX_FUNCTION_LINES:
                    long[f"{p.relative_to(SRC)}::{node.name}"] = n
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_any_within_budget() -> None:
    counts = {
        str(p.relative_to(SRC)): n
        for p in _sources()
        if (n := len(re.findall(r"\bAny\b", p.read_text(encoding="utf-8"))))
    }
    total = sum(counts.values())
    worst = sorted(counts.items(), key=lambda kv: -kv[1])[:10]
    assert total <= ANY_BUDGET, f"{total} `Any` in src/ (budget {ANY_BUDGET}); most: {worst}"
