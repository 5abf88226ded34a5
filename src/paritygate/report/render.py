"""report.md and report.html from the jinja2 templates in ``templates/``."""

from __future__ import annotations

import html
import json
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from paritygate.fragments import Rendered
from paritygate.report.plots import lm_delta_plots
from paritygate.report.table import ICON, fmt
from paritygate.result import CheckResult
from paritygate.rootcause import RootCause, ordered

if TYPE_CHECKING:
    import jinja2


@lru_cache(maxsize=2)
def _env(autoescape: bool) -> jinja2.Environment:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("paritygate.report", "templates"),
        autoescape=autoescape,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["md_cell"] = _md_cell
    env.filters["h"] = html.escape  # quotes as &quot; / &#x27;, as the fragments always wrote
    return env


def render_fragment(template: str, **values: object) -> str:
    """A report fragment from ``templates/<template>``, without autoescaping (the templates
    escape each cell with the ``h`` filter) and without the template file's final newline."""
    return _env(False).get_template(template).render(**values).removesuffix("\n")


def table_markdown(header: list[str], rows: list[list[str]]) -> str:
    """``rows`` under ``header`` as a Markdown table (cells as given, no trailing newline)."""
    return render_fragment("table.md.j2", header=header, rows=rows)


def table_html(header: list[str], rows: list[list[str]]) -> str:
    """``rows`` under ``header`` as an HTML ``<table>`` (cells escaped)."""
    return render_fragment("table.html.j2", header=header, rows=rows)


def section(title: str, header: list[str], cells: list[list[str]], note: str = "") -> Rendered:
    """``cells`` under ``header`` as a Markdown table and an HTML ``<section>`` titled
    ``title``; ``note`` is a sentence shown above the table. No cells, no fragment."""
    if not cells:
        return Rendered()
    lead = f"{title}: {note}" if note else f"{title}:"
    markdown = table_markdown([_md_cell(h) for h in header],
                              [[_md_cell(c) for c in row] for row in cells])
    fragment = render_fragment("section.html.j2", title=title, note=note,
                               table=table_html(header, cells))
    return Rendered(markdown=f"{lead}\n\n{markdown}", html=fragment)


def _md_cell(text: object, limit: int = 0) -> str:
    """Text safe inside a Markdown table cell (pipes escaped, one line)."""
    out = str(text).replace("|", "\\|").replace("\n", " ")
    if limit and len(out) > limit:
        out = out[: limit - 3] + "..."
    return out


def _root(data: dict[str, Any]) -> RootCause | None:
    rc = data.get("root_cause")
    if not rc:
        return None
    return RootCause(rc["check"], rc["kind"], rc["message"], tuple(rc["explains"]), rc["fix"],
                     rc.get("finding"))


def _rows(data: dict[str, Any], extras: dict[str, Rendered], *, html: bool) -> list[dict]:
    results = [CheckResult.from_json(c) for c in data["checks"]]
    rows = []
    for r in ordered(results, _root(data)):
        key = r.key_metric or ""
        golden = r.golden or {}
        row: dict[str, Any] = {
            "id": r.id, "status": r.status, "message": r.message, "fix": r.fix,
            "consequence_of": r.consequence_of, "reasons": r.reasons, "key": key,
            "value": fmt(r.metrics.get(key)) if key else "",
            "threshold": fmt(r.thresholds.get(key)) if key else "",
            "golden": fmt(golden.get(key)) if key else "",
            "breach": bool(key) and key in r.failed_metrics,
        }
        if html:
            row["metrics"] = [
                {"name": name, "value": fmt(value), "threshold": fmt(r.thresholds.get(name)),
                 "golden": fmt(golden.get(name)), "breach": name in r.failed_metrics}
                for name, value in r.metrics.items()
            ]
            row["plots"] = lm_delta_plots(r) if r.status in ("pass", "fail") else []
            row["extra_html"] = extras[r.id].html if r.id in extras else ""
            row["details"] = (json.dumps(r.details, indent=1, default=str)
                              if r.details else "")
        rows.append(row)
    return rows


def report_markdown(data: dict[str, Any], extras: dict[str, Rendered]) -> str:
    """report.md (also the GitHub step summary): counts, root cause, one row per check."""
    sections = [{"id": cid, "markdown": e.markdown} for cid, e in extras.items() if e.markdown]
    return _env(False).get_template("report.md.j2").render(
        data=data, icon=ICON, root=data.get("root_cause"), rows=_rows(data, extras, html=False),
        extras=sections,
    )


def report_html(data: dict[str, Any], extras: dict[str, Rendered]) -> str:
    """report.html: self-contained (inline CSS, plots as base64 PNG), root cause first,
    failing checks before passing ones, breaching cells highlighted, then details."""
    return _env(True).get_template("report.html.j2").render(
        data=data, root=data.get("root_cause"), rows=_rows(data, extras, html=True),
        environment=json.dumps(data.get("environment", {}), indent=1),
    )


def render_page(template: str, **values: object) -> str:
    """A whole HTML page from ``templates/<template>``, autoescaped."""
    return _env(True).get_template(template).render(**values)
