"""Documentation generated from the code, so the docs cannot drift from it.

The checklist table comes from the check registry (ids, families, marks, summaries), the
config reference from the config models (:mod:`paritygate.report.configdoc`). The
committed README and docs pages hold the generated text between marker comments;
``python -m paritygate.report.docgen`` rewrites them and ``--check`` exits 1 when one is stale
(a test runs the same comparison).
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
            "limits": limits_table(), **reference_pages()}


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


def main(argv: list[str] | None = None) -> int:
    """Rewrite the generated blocks under the repository root (``--check``: report stale ones)."""
    args = sys.argv[1:] if argv is None else argv
    check = "--check" in args
    positional = [a for a in args if not a.startswith("--")]
    root = Path(positional[0]) if positional else Path.cwd()
    stale = []
    for path, text in spliced_files(root).items():
        if path.read_text(encoding="utf-8") != text:
            stale.append(path)
            if not check:
                path.write_text(text, encoding="utf-8")
    for path in stale:
        print(f"{'stale' if check else 'updated'}: {path}")
    return 1 if check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
