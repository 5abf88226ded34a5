"""A check's own table as report fragments: one Markdown table and one HTML section."""

from __future__ import annotations

import html

from paritygate.check import Rendered


def table(title: str, header: list[str], cells: list[list[str]], note: str = "") -> Rendered:
    """``cells`` under ``header`` as a Markdown table and an HTML ``<section>`` titled ``title``;
    ``note`` is a sentence shown above the table."""
    if not cells:
        return Rendered()

    def md_cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    md = "\n".join([
        *([f"{title}: {note}", ""] if note else [f"{title}:", ""]),
        "| " + " | ".join(map(md_cell, header)) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(map(md_cell, row)) + " |" for row in cells),
    ])
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
                   for row in cells)
    lead = f"<p>{html.escape(note)}</p>" if note else ""
    fragment = (f"<section><h3>{html.escape(title)}</h3>{lead}"
                f"<table><tr>{head}</tr>{body}</table></section>")
    return Rendered(markdown=md, html=fragment)
