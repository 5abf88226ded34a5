"""The package's shape: no import cycles, and dependencies point one way.

Checks depend on families, engines and metrics, never the reverse; engines depend on
no family; each family package has the same parts. Imports under ``TYPE_CHECKING``
are annotations only and do not count.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

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
    """Each family has its context, probes and export; its config section is a schema below
    the families, in the config package (``paritygate/config/<family>.py``)."""
    for family in ("policy", "causal_lm", "hf_model"):
        folder = SRC / "families" / family
        for part in ("__init__", "context", "probes", "export"):
            assert (folder / f"{part}.py").is_file(), f"families/{family} has no {part}.py"
        assert (SRC / "config" / f"{family}.py").is_file(), f"config/ has no {family}.py"
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


# --- findings are records: decisions read kinds, never a message's text ----------------------

RENDERERS = ("paritygate.report", "paritygate.precision.render", "paritygate.cli",
             "paritygate.plugin")
"""Modules that turn results into text for people; only they may read a message's wording."""
DECIDERS = ("paritygate.verdict", "paritygate.golden", "paritygate.rootcause",
            "paritygate.result")
TEXT_FIELDS = ("message", "cause", "reasons", "findings")


def _is_text(node: ast.AST, bound: set[str]) -> bool:
    """A message or cause, the list of reasons or findings, one of them by index, or a loop
    variable over them (``r.kind`` of such a variable is a kind, not text)."""
    if isinstance(node, ast.Attribute):
        return node.attr in TEXT_FIELDS
    if isinstance(node, ast.Subscript):
        return _is_text(node.value, bound)
    if isinstance(node, ast.Name):
        return node.id in bound
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr in ("lower", "strip", "casefold") and _is_text(node.func.value, bound)
    return False


def _stringish(node: ast.AST) -> bool:
    """A string literal, an f-string, a constant's NAME, or a collection holding one."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.Name):
        return node.id.isupper()
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return any(_stringish(e) for e in node.elts)
    return False


def text_reads(tree: ast.AST) -> list[str]:
    """Comparisons, substring and regex tests on a message, a cause, a reason or a finding."""
    bound: set[str] = set()  # names bound by iterating reasons / findings
    for node in ast.walk(tree):
        if isinstance(node, (ast.comprehension, ast.For)) and _is_text(node.iter, set()):
            bound |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and not all(
                isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops):
            operands = [node.left, *node.comparators]
            if any(_is_text(o, bound) for o in operands) and any(map(_stringish, operands)):
                found.append(ast.unparse(node))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            func = node.func
            if func.attr in ("startswith", "endswith", "find", "index", "count") and \
                    _is_text(func.value, bound):
                found.append(ast.unparse(node))
            if isinstance(func.value, ast.Name) and func.value.id == "re" and \
                    any(_is_text(a, bound) for a in node.args):
                found.append(ast.unparse(node))
    return found


def test_no_module_but_the_renderers_reads_message_text() -> None:
    reads = {}
    for name, path in _modules().items():
        if name.startswith(RENDERERS):
            continue
        hits = text_reads(ast.parse(path.read_text(encoding="utf-8")))
        if hits:
            reads[name] = hits
    assert not reads, f"decide on kinds, not on a message's text: {reads}"


def test_deciding_modules_use_no_regular_expressions() -> None:
    for name in DECIDERS:
        tree = ast.parse(_modules()[name].read_text(encoding="utf-8"))
        imported = {a.name for n in _runtime_imports(tree) if isinstance(n, ast.Import)
                    for a in n.names}
        assert "re" not in imported, f"{name} imports re: match kinds, not text"


def test_text_reads_finds_planted_reads() -> None:
    planted = ast.parse(
        'regressed = any("golden" in r for r in result.reasons)\n'
        'only = result.reasons == [NO_GOLDEN]\n'
        'hit = re.search(pattern, result.message)\n'
        'fill = m.findings[0].message.startswith("y")\n'
        'kind = [r.kind for r in result.reasons] == ["no_golden"]\n'  # a kind: fine
    )
    assert len(text_reads(planted)) == 4


# --- the check-family contract is typed: a check never asks which family it measures --------


def family_probes(tree: ast.AST) -> list[str]:
    """``ctx.family == "..."`` style branches and ``getattr`` / ``hasattr`` probes of the
    context's (or its config's) members."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(isinstance(o, ast.Attribute) and o.attr == "family" for o in operands):
                found.append(ast.unparse(node))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr") and node.args
              and ast.unparse(node.args[0]) in ("ctx", "ctx.config")):
            found.append(ast.unparse(node))
    return found


def test_checks_never_branch_on_a_family_or_probe_the_context() -> None:
    probes = {}
    for path in sorted((SRC / "checks").glob("*.py")):
        hits = family_probes(ast.parse(path.read_text(encoding="utf-8")))
        if hits:
            probes[path.name] = hits
    assert not probes, f"declare one measure per family (CheckSpec.measures) instead: {probes}"


def test_family_probes_finds_planted_branches() -> None:
    planted = ast.parse(
        'if ctx.family == "causal_lm":\n    pass\n'
        'x = getattr(ctx, "declared_dtype", None)\n'
        'y = hasattr(ctx.config, "precision")\n'
        'z = getattr(ctx.logprobs.fn, "convention", "model")\n'  # the user's function: fine
    )
    assert len(family_probes(planted)) == 3


def test_only_the_gate_reads_the_configs_thresholds() -> None:
    """A check learns what the user set from its ``Thresholds``, never from the raw config."""
    readers = []
    for name, path in _modules().items():
        if name in ("paritygate.gate", "paritygate.config"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Attribute) and node.attr == "thresholds"
                    and isinstance(node.value, ast.Attribute) and node.value.attr == "config"):
                readers.append(f"{name}: {ast.unparse(node)}")
    assert not readers, readers


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


def test_registration_is_one_module_per_check() -> None:
    """A check registers by its module alone: the registry finds every module of
    ``paritygate/checks`` (each with a CHECK spec and a POSITION), and the root-cause edges a
    module declares are the edges of its own check."""
    import importlib

    from paritygate.checks import CHECK_IDS
    from paritygate.rootcause import GRAPH

    package = Path(importlib.import_module("paritygate.checks").__file__ or "").parent
    modules = sorted(p.stem for p in package.glob("*.py") if not p.stem.startswith("_"))
    assert sorted(CHECK_IDS) == modules
    positions = [importlib.import_module(f"paritygate.checks.{cid}").POSITION
                 for cid in CHECK_IDS]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    for cid in CHECK_IDS:
        spec = importlib.import_module(f"paritygate.checks.{cid}").CHECK
        assert spec.id == cid
        for edge in getattr(importlib.import_module(f"paritygate.checks.{cid}"), "CAUSES", ()):
            assert edge.check == cid, f"{cid} declares an edge of {edge.check}"
            assert set(edge.explains) <= set(CHECK_IDS), edge
    ranks = [edge.rank for edge in GRAPH]
    assert ranks == sorted(ranks) and len(set(ranks)) == len(ranks)


def test_the_registry_index_is_the_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    """``checks/_index.py`` (ids, order, families) is what the modules say; an index that
    misses a module is not trusted: the registry reads every module instead."""
    import paritygate.checks as registry
    from paritygate.checks._index import FAMILIES

    assert registry.scan() == FAMILIES
    assert tuple(FAMILIES) == registry.CHECK_IDS
    for cid, families in FAMILIES.items():
        assert registry.get_check(cid).families == families
    stale = {cid: fams for cid, fams in FAMILIES.items() if cid != "serving_replay"}
    monkeypatch.setattr(registry, "FAMILIES", stale)
    assert registry._registered() == registry.scan()


def test_a_policy_run_imports_only_policy_checks() -> None:
    """Registry, root-cause graph and report renderers import only the checks a run has:
    a policy gate never imports an LM check's module (nor its records and metrics)."""
    code = (
        "import sys\n"
        "from paritygate.checks import checks_for\n"
        "from paritygate.result import CheckResult\n"
        "from paritygate.report.table import summary_table\n"
        "specs = checks_for('policy')\n"
        "summary_table([CheckResult(s.id, 'fail', 'x', {}, None, {}) for s in specs])\n"
        "import paritygate.report\n"
        "print(' '.join(m for m in sys.modules if m.startswith('paritygate.checks.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    from paritygate.checks._index import FAMILIES

    lm_only = {f"paritygate.checks.{cid}" for cid, fams in FAMILIES.items()
               if "policy" not in fams}
    assert not lm_only & set(out), sorted(lm_only & set(out))
    assert {f"paritygate.checks.{cid}" for cid, fams in FAMILIES.items()
            if "policy" in fams} <= set(out)


def test_a_check_registers_in_its_own_module() -> None:
    """``POSITION`` and ``CAUSES`` are assigned in the check's module, not imported into it
    from a module that exists to make room: registration sits beside the check."""
    package = SRC / "checks"
    for path in sorted(package.glob("[!_]*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        assigned = {t.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
                    for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                    if isinstance(t, ast.Name)}
        imported = {a.asname or a.name for node in tree.body
                    if isinstance(node, ast.ImportFrom) for a in node.names}
        assert "POSITION" in assigned, f"{path.name}: POSITION is not assigned in the module"
        assert not {"POSITION", "CAUSES", "CHECK"} & imported, \
            f"{path.name} imports its registration"


def test_one_renderer_registry_and_checks_build_no_report_content() -> None:
    """Report tables and figures are drawn in one place, ``paritygate.report.RENDERERS``,
    keyed by check id: a check module imports nothing that builds report content."""
    from paritygate.check import CheckSpec
    from paritygate.checks import CHECK_IDS
    from paritygate.report import RENDERERS

    assert set(RENDERERS) <= set(CHECK_IDS)
    assert "render" not in CheckSpec.__dataclass_fields__
    drawing = ("paritygate.report", "paritygate.fragments", "paritygate.precision.render",
               "paritygate.precision.plot")
    wrong = sorted(f"{src} -> {dst}" for src, dsts in import_graph().items() for dst in dsts
                   if src.startswith("paritygate.checks") and dst.startswith(drawing))
    assert wrong == [], "a check measures; report/ renders its records"
