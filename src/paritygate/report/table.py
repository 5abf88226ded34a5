"""Cell formatting shared by the terminal table, Markdown and HTML."""

from __future__ import annotations

from paritygate.result import CheckResult
from paritygate.rootcause import RootCause, explain, ordered

ICON = {"pass": "✅", "fail": "❌", "skip": "⏭️", "error": "💥", "nothing_verified": "⚠️"}


def fmt(value: object) -> str:
    """A metric value for people: 4 significant digits; non-finite markers as nan/inf."""
    if value is None:
        return "–"
    if isinstance(value, dict) and "nonfinite" in value:
        return str(value["nonfinite"])
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def key_row(result: CheckResult) -> tuple[str, str, str, str]:
    """(metric name, value, threshold, golden) of a result's key metric (the failing one)."""
    key = result.key_metric
    if key is None:
        return ("", "", "", "")
    golden = (result.golden or {}).get(key)
    return (key, fmt(result.metrics.get(key)), fmt(result.thresholds.get(key)), fmt(golden))


def breaching(result: CheckResult, metric: str | None) -> bool:
    """True when ``metric`` is one the verdict failed the check on (highlighted)."""
    return metric is not None and metric in result.failed_metrics


def summary_table(results: list[CheckResult]) -> list[str]:
    """Terminal lines: the root cause first, then one row per check (failing first) with its
    key metric, threshold and golden value, then one line per failure."""
    explained, cause = explain(results)
    rows_in = ordered(explained, cause)
    rows = [("check", "status", "key metric", "value", "threshold", "golden")]
    for r in rows_in:
        name, value, thr, gold = key_row(r)
        if breaching(r, r.key_metric):
            value = f"{value} !"
        rows.append((r.id, r.status, name, value, thr, gold))
    widths = [max(len(row[i]) for row in rows) for i in range(6)]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines[:0] = root_cause_lines(cause)
    for r in rows_in:
        if r.status in ("fail", "error"):
            lines.append(f"{r.id}: {r.message}")
        elif r.status == "skip":
            lines.append(f"{r.id}: skipped: {r.message}")
    return lines


def root_cause_lines(cause: RootCause | None) -> list[str]:
    if cause is None:
        return []
    lines = [f"root cause: {cause.check}"]
    if cause.explains:
        lines[0] += f" (explains {', '.join(cause.explains)})"
    return lines
