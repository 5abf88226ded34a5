"""The package's shape: no import cycles, and dependencies point one way.

Checks depend on families, engines and metrics, never the reverse; engines depend on
no family; each family package has the same parts. Imports under ``TYPE_CHECKING``
are annotations only and do not count.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "paritygate"


def _modules() -> dict[str, Path]:
    mods = {}
    for path in SRC.rglob("*.py"):
        parts = ("paritygate", *path.relative_to(SRC).with_suffix("").parts)
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = path
    return mods


def _runtime_imports(tree: ast.AST) -> list[ast.AST]:
    """Import nodes outside ``if TYPE_CHECKING:`` blocks."""
    out: list[ast.AST] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the paritygate modules it imports at run time (lazy imports included)."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in _runtime_imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    target = node.module or ""
                candidates = [target, *(f"{target}.{a.name}" for a in node.names)]
            else:
                candidates = [a.name for a in node.names]
            for cand in candidates:
                while cand and cand not in mods:
                    cand = cand.rpartition(".")[0]
                if cand and cand != name:
                    graph[name].add(cand)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


def layer(module: str) -> str:
    """The unit whose dependencies are constrained: a subpackage, or a top-level module."""
    parts = module.split(".")
    if len(parts) > 2 and parts[1] == "families":
        return ".".join(parts[:3])
    return ".".join(parts[:2])


def test_no_module_import_cycles() -> None:
    assert cycles(import_graph()) == []


def test_no_package_import_cycles() -> None:
    graph: dict[str, set[str]] = {}
    for src, targets in import_graph().items():
        graph.setdefault(layer(src), set()).update(
            layer(t) for t in targets if layer(t) != layer(src))
    assert cycles(graph) == []


def test_dependencies_point_from_checks_to_families_and_engines() -> None:
    graph = import_graph()
    lower = ("paritygate.families", "paritygate.engines", "paritygate.metrics",
             "paritygate.precision")
    wrong = sorted(f"{src} -> {dst}" for src, dsts in graph.items() for dst in dsts
                   if src.startswith(lower) and dst.startswith("paritygate.checks."))
    assert wrong == [], "families, engines, metrics and precision must not import checks"
    wrong = sorted(f"{src} -> {dst}" for src, dsts in graph.items() for dst in dsts
                   if src.startswith("paritygate.engines") and dst.startswith(
                       "paritygate.families"))
    assert wrong == [], "engines must not import families"


def test_checks_reach_family_helpers_through_the_context() -> None:
    graph = import_graph()
    wrong = sorted(f"{src} -> {dst}" for src, dsts in graph.items() for dst in dsts
                   if src.startswith("paritygate.checks.")
                   and dst.startswith(("paritygate.families.policy.",
                                       "paritygate.families.causal_lm.",
                                       "paritygate.families.hf_model.")))
    assert wrong == []


def test_every_family_package_has_the_same_parts() -> None:
    for family in ("policy", "causal_lm", "hf_model"):
        folder = SRC / "families" / family
        for part in ("__init__", "config", "context", "probes", "export"):
            assert (folder / f"{part}.py").is_file(), f"families/{family} has no {part}.py"
        init = (folder / "__init__.py").read_text(encoding="utf-8")
        assert "def build_context(" in init and "def export_artifact(" in init


def test_every_engine_lives_under_engines() -> None:
    engine_classes = ("TorchEngine", "OnnxRuntimeEngine", "HFGenerateEngine", "VLLMEngine")
    for path in SRC.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        for cls in engine_classes:
            if f"class {cls}" in text:
                assert path.parent.name == "engines", f"{cls} defined in {path}"


def test_cycle_finder_finds_a_planted_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_files_is_the_ground_floor_every_writer_shares() -> None:
    graph = import_graph()
    assert graph["paritygate.files"] == set(), "paritygate.files must import no paritygate module"
    for user in ("paritygate.golden", "paritygate.report", "paritygate.precision.render",
                 "paritygate.precision.plot", "paritygate.families.policy.export",
                 "paritygate.families.causal_lm.export"):
        assert "paritygate.files" in graph[user], f"{user} does not write through paritygate.files"
    writers = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
                     if p.name != "files.py" and ("os.replace(" in (t := p.read_text("utf-8"))
                                                  or "mkstemp(" in t))
    assert writers == [], "atomic writes belong in paritygate.files"
