"""Report artifacts: report.json (the contract), report.md, report.html and junit.xml.

Every file is written atomically. ``report.md`` is also appended to
``$GITHUB_STEP_SUMMARY`` when that variable is set (GitHub Actions step summary).
"""

from __future__ import annotations

import html
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

from paritygate.check import Rendered
from paritygate.checks import get_check
from paritygate.golden import atomic_write_text, dump_json
from paritygate.result import CheckResult

ICON = {"pass": "✅", "fail": "❌", "skip": "⏭️", "error": "💥"}


@dataclass
class WrittenReport:
    directory: Path
    status: str
    results: list[CheckResult]
    files: list[str] = field(default_factory=list)


NOTHING_VERIFIED = "nothing_verified"


def overall_status(results: list[CheckResult], *, allow_skips: bool = False) -> str:
    """``fail`` on any failure; ``nothing_verified`` when no check passed (every selected
    check skipped, or none selected) unless the caller opted in with ``allow_skips``."""
    if any(r.status in ("fail", "error") for r in results):
        return "fail"
    if not any(r.status == "pass" for r in results) and not allow_skips:
        return NOTHING_VERIFIED
    return "pass"


def nothing_verified_reason(results: list[CheckResult]) -> str:
    """Why a run verified nothing, for the one line the CLI prints."""
    if not results:
        return "nothing was verified: no check was selected"
    skipped = "; ".join(f"{r.id}: {r.message}" for r in results)
    return f"nothing was verified: every selected check skipped: {skipped}"


def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def key_row(result: CheckResult) -> tuple[str, str, str, str]:
    """(metric name, value, threshold, golden) of a result's key metric."""
    key = result.key_metric
    if key is None:
        return ("", "", "", "")
    golden = (result.golden or {}).get(key)
    return (key, _fmt(result.metrics.get(key)), _fmt(result.thresholds.get(key)), _fmt(golden))


def summary_table(results: list[CheckResult]) -> list[str]:
    """Terminal lines: one per check with its key metric, threshold and golden value."""
    rows = [("check", "status", "key metric", "value", "threshold", "golden")]
    for r in results:
        name, value, thr, gold = key_row(r)
        rows.append((r.id, r.status, name, value, thr, gold))
    widths = [max(len(row[i]) for row in rows) for i in range(6)]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for r in results:
        if r.status in ("fail", "error"):
            lines.append(f"{r.id}: {r.message}")
        elif r.status == "skip":
            lines.append(f"{r.id}: skipped: {r.message}")
    return lines


def report_json(gate: Any, results: list[CheckResult]) -> dict[str, Any]:
    from paritygate.provenance import environment

    ctx = gate.context
    return {
        "name": gate.config.name,
        "status": overall_status(results, allow_skips=getattr(gate, "allow_skips", False)),
        "family": gate.config.family,
        "config": str(gate.config.path),
        "checkpoint": {"path": str(ctx.checkpoint_path), "sha256": ctx.checkpoint_sha256},
        "environment": environment(),
        "checks": [r.to_json() for r in results],
    }


def report_markdown(data: dict[str, Any], extras: dict[str, Rendered]) -> str:
    status = data["status"]
    lines = [
        f"## paritygate: `{data['name']}` {ICON.get(status, '')} {status.upper()}",
        "",
        f"Checkpoint `{data['checkpoint']['path']}` (sha256 `{data['checkpoint']['sha256'][:12]}`)",
        "",
        "| check | status | key metric | value | threshold | golden | message |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in data["checks"]:
        r = CheckResult.from_json(c)
        name, value, thr, gold = key_row(r)
        msg = r.message.replace("|", "\\|").replace("\n", " ")
        if len(msg) > 300:
            msg = msg[:297] + "..."
        lines.append(
            f"| `{r.id}` | {ICON.get(r.status, '')} {r.status} | {name} | {value} | {thr} "
            f"| {gold} | {msg} |"
        )
    for cid, extra in extras.items():
        if extra.markdown:
            lines += ["", f"### {cid}", "", extra.markdown]
    return "\n".join(lines) + "\n"


_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 8px;
text-align:left;font-size:13px}th{background:#f3f3f3}.pass{color:#176f2c}.fail,.error{color:#b00020}
.skip{color:#777}code{background:#f5f5f5;padding:0 3px}details{margin:.3em 0 1em 0}
img{max-width:100%}
"""


def report_html(data: dict[str, Any], extras: dict[str, Rendered]) -> str:
    e = html.escape
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>paritygate {e(data['name'])}</title><style>{_CSS}</style></head><body>",
        f"<h1>paritygate: {e(data['name'])} <span class='{e(data['status'])}'>"
        f"{e(data['status'].upper())}</span></h1>",
        f"<p>Checkpoint <code>{e(data['checkpoint']['path'])}</code> sha256 "
        f"<code>{e(data['checkpoint']['sha256'])}</code></p>",
        "<table><tr><th>check</th><th>status</th><th>key metric</th><th>value</th>"
        "<th>threshold</th><th>golden</th><th>message</th></tr>",
    ]
    for c in data["checks"]:
        r = CheckResult.from_json(c)
        name, value, thr, gold = key_row(r)
        parts.append(
            f"<tr><td><a href='#{e(r.id)}'>{e(r.id)}</a></td><td class='{e(r.status)}'>"
            f"{e(r.status)}</td><td>{e(name)}</td><td>{e(value)}</td><td>{e(thr)}</td>"
            f"<td>{e(gold)}</td><td>{e(r.message)}</td></tr>"
        )
    parts.append("</table>")
    for c in data["checks"]:
        r = CheckResult.from_json(c)
        parts.append(
            f"<h2 id='{e(r.id)}'>{e(r.id)} <span class='{e(r.status)}'>{e(r.status)}"
            f"</span></h2><p>{e(r.message)}</p>"
        )
        if r.metrics:
            parts.append(
                "<table><tr><th>metric</th><th>value</th><th>threshold</th><th>golden</th></tr>"
            )
            for name, value in r.metrics.items():
                parts.append(
                    f"<tr><td>{e(name)}</td><td>{e(_fmt(value))}</td>"
                    f"<td>{e(_fmt(r.thresholds.get(name)))}</td>"
                    f"<td>{e(_fmt((r.golden or {}).get(name)))}</td></tr>"
                )
            parts.append("</table>")
        if r.id in extras and extras[r.id].html:
            parts.append(extras[r.id].html)
        if r.details:
            details = json.dumps(r.details, indent=1, default=str)
            parts.append(f"<details><summary>details</summary><pre>{e(details)}</pre></details>")
    parts.append(f"<h2>environment</h2><pre>{e(json.dumps(data['environment'], indent=1))}</pre>")
    parts.append("</body></html>")
    return "\n".join(parts)


def junit_xml(data: dict[str, Any]) -> str:
    checks = data["checks"]
    suite = ET.Element(
        "testsuite",
        name=f"paritygate.{data['name']}",
        tests=str(len(checks)),
        failures=str(sum(c["status"] == "fail" for c in checks)),
        errors=str(sum(c["status"] == "error" for c in checks)),
        skipped=str(sum(c["status"] == "skip" for c in checks)),
        time=f"{sum(c.get('duration_s', 0.0) for c in checks):.3f}",
    )
    for c in checks:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=f"paritygate.{data['name']}",
            name=c["id"],
            time=f"{c.get('duration_s', 0.0):.3f}",
        )
        props = ET.SubElement(case, "properties")
        for name, value in c["metrics"].items():
            ET.SubElement(props, "property", name=name, value=_fmt(value))
        if c["status"] in ("fail", "error"):
            tag = "failure" if c["status"] == "fail" else "error"
            el = ET.SubElement(case, tag, message=c["message"][:1000])
            el.text = c["message"]
        elif c["status"] == "skip":
            ET.SubElement(case, "skipped", message=c["message"])
    root = ET.Element("testsuites")
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def write_reports(gate: Any, results: list[CheckResult], directory: Path) -> WrittenReport:
    """Write every report artifact into ``directory`` and return what was written."""
    directory.mkdir(parents=True, exist_ok=True)
    extras: dict[str, Rendered] = {}
    files: list[str] = []
    for r in results:
        spec = get_check(r.id)
        if spec.render is not None and r.status in ("pass", "fail"):
            extras[r.id] = spec.render(r, directory)
            files += extras[r.id].files
    data = report_json(gate, results)
    atomic_write_text(directory / "report.json", dump_json(data))
    md = report_markdown(data, extras)
    atomic_write_text(directory / "report.md", md)
    atomic_write_text(directory / "report.html", report_html(data, extras))
    atomic_write_text(directory / "junit.xml", junit_xml(data))
    files += ["report.json", "report.md", "report.html", "junit.xml"]
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a", encoding="utf-8") as fh:
            fh.write(md)
    return WrittenReport(directory, data["status"], results, files)
