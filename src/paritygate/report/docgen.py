"""Files generated from the code, so the docs and the gate suite cannot drift from it.

The checklist table comes from the check registry (ids, families, marks, summaries), the
config reference from the config models (:mod:`paritygate.report.configdoc`). The
committed README and docs pages hold the generated text between marker comments. Whole
files are generated too: each check's gate file (``gates/test_<id>.py``, from its id and
marks), the published JSON Schemas (``schemas/``) and the check registry's index
(``checks/_index.py``, which lets a run import only its family's checks).
``python -m paritygate.report.docgen`` rewrites them all and ``--check`` exits 1 when one is
stale or missing (a test runs the same comparison), so a new check's shared files are written
by this one command.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from paritygate.checks import CHECK_IDS, get_check

CHECKLIST = "checklist"


def checklist_table() -> str:
    """The checklist as a Markdown table: one row per registered check, in registry order."""
    rows = ["| id | families | marks | proves |", "|---|---|---|---|"]
    for check_id in CHECK_IDS:
        spec = get_check(check_id)
        families = ", ".join(f"`{f}`" for f in spec.families)
        marks = ", ".join(f"`{m}`" for m in spec.marks)
        rows.append(f"| `{spec.id}` | {families} | {marks} | {spec.summary} |")
    return "\n".join(rows) + "\n"


def root_cause_actions() -> str:
    """Every ``root_cause.kind`` of the explanation graph with its root check, why the checks
    it explains fail too, and the likely fix, as a Markdown table (the graph's own words)."""
    from paritygate.rootcause import GRAPH

    rows = ["| `root_cause.kind` | root check | why the explained checks fail too | what to do |",
            "|---|---|---|---|"]
    seen: set[tuple[str, str]] = set()
    for edge in GRAPH:
        if (edge.kind, edge.check) in seen:
            continue
        seen.add((edge.kind, edge.check))
        fix = edge.fix or "see the root check's message and the page of its check"
        rows.append(f"| `{edge.kind}` | `{edge.check}` | {edge.why} | {fix} |")
    return "\n".join(rows) + "\n"


def needs_table() -> str:
    """What a check may need from its family (:data:`paritygate.check.NEEDS`)."""
    from paritygate.check import NEEDS

    rows = ["| need | what the family loads and validates for it |", "|---|---|"]
    rows += [f"| `{name}` | {what} |" for name, what in NEEDS.items()]
    return "\n".join(rows) + "\n"


def benchmark_table(root: Path) -> str:
    """Each script in ``benchmarks/``: what it measures (its docstring's first paragraph) and
    the docs pages that quote its figures."""
    import ast

    pages = sorted((root / "docs").rglob("*.md"))
    rows = ["| script | what it measures | figures on |", "|---|---|---|"]
    for script in sorted((root / "benchmarks").glob("bench_*.py")):
        doc = ast.get_docstring(ast.parse(script.read_text(encoding="utf-8"))) or ""
        summary = " ".join(doc.split("\n\n")[0].split()).replace("``", "`")
        cited = [page for page in pages if f"benchmarks/{script.name}" in
                 page.read_text(encoding="utf-8") and page.name != "benchmarks.md"]
        links = ", ".join(f"[{page.stem}]({page.relative_to(root / 'docs').as_posix()})"
                          for page in cited) or "its own output"
        rows.append(f"| `benchmarks/{script.name}` | {summary} | {links} |")
    return "\n".join(rows) + "\n"


def _markers(name: str) -> tuple[str, str]:
    return (f"<!-- generated:{name} (python -m paritygate.report.docgen) -->",
            f"<!-- end generated:{name} -->")


def splice(text: str, name: str, body: str) -> str:
    """``text`` with the block between ``name``'s markers replaced by ``body``.

    Raises ``ValueError`` when the markers are missing, so a page that lost them is noticed.
    """
    start, end = _markers(name)
    pattern = re.compile(re.escape(start) + r"\n.*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise ValueError(f"no '{start}' ... '{end}' block")
    return pattern.sub(lambda _: f"{start}\n{body}{end}", text, count=1)


def generated_blocks() -> dict[str, str]:
    """Each generated block's name and its current text."""
    from paritygate.report.configdoc import reference_pages
    from paritygate.report.limitsdoc import limits_table

    return {CHECKLIST: checklist_table(), "root-cause-actions": root_cause_actions(),
            "limits": limits_table(), "needs": needs_table(), **reference_pages()}


INDEX = Path("src/paritygate/checks/_index.py")
"""The check registry's index, relative to the repository root."""


def check_index() -> str:
    """The text of the check registry's index: each check id and its families, in checklist
    order, read from the check modules themselves."""
    from paritygate.checks import scan

    def names(families: tuple[str, ...]) -> str:
        return ", ".join(f'"{family}"' for family in families) + ("," * (len(families) == 1))

    rows = "".join(f'    "{cid}": ({names(families)}),\n' for cid, families in scan().items())
    return ('"""Generated by ``python -m paritygate.report.docgen`` from the check modules '
            '(their\n``POSITION`` and ``CHECK.families``): each check id and the families it '
            'applies to, in\nchecklist order. The registry reads it so a run imports only '
            'its own family\'s checks."""\n\n'
            f"FAMILIES: dict[str, tuple[str, ...]] = {{\n{rows}}}\n")


def spliced_files(root: Path) -> dict[Path, str]:
    """Every file under ``root`` that holds a generated block, with its up-to-date text."""
    blocks = {**generated_blocks(), "benchmarks": benchmark_table(root)}
    files = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    result: dict[Path, str] = {}
    for path in files:
        text = path.read_text(encoding="utf-8")
        new = text
        for name, body in blocks.items():
            if _markers(name)[0] in new:
                new = splice(new, name, body)
        result[path] = new
    return result


GATE_FILE = '''"""Gate: `{id}`, measured by `paritygate.checks.{id}`."""

import pytest


{marks}
def test_{id}(gate_check):
    gate_check("{id}")
'''
"""A check's gate file: one pytest test with the check's marks (see :mod:`paritygate.plugin`)."""


def gate_files(root: Path) -> dict[Path, str]:
    """Each registered check's gate file under ``root/gates`` with its text."""
    files = {}
    for check_id in CHECK_IDS:
        marks = "\n".join(f"@pytest.mark.{mark}" for mark in get_check(check_id).marks)
        files[root / "gates" / f"test_{check_id}.py"] = GATE_FILE.format(id=check_id,
                                                                         marks=marks)
    return files


def generated_files(root: Path) -> dict[Path, str]:
    """Every generated file under ``root`` with its up-to-date text: the pages holding
    generated blocks, the gate files, the published schemas and the check registry's index."""
    from paritygate.report.model import schema_texts

    schemas = {root / "schemas" / name: text for name, text in schema_texts().items()}
    return {**spliced_files(root), **gate_files(root), **schemas, root / INDEX: check_index()}


def main(argv: list[str] | None = None) -> int:
    """Rewrite the generated files under the repository root (``--check``: report stale or
    missing ones)."""
    args = sys.argv[1:] if argv is None else argv
    check = "--check" in args
    positional = [a for a in args if not a.startswith("--")]
    root = Path(positional[0]) if positional else Path.cwd()
    stale = []
    for path, text in generated_files(root).items():
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            stale.append(path)
            if not check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
    for path in stale:
        print(f"{'stale' if check else 'updated'}: {path}")
    return 1 if check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
