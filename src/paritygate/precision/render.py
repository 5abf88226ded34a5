"""Report artifacts of the precision check: CSV, JSON, PNG, and Markdown/HTML fragments."""

from __future__ import annotations

import base64
import csv
import html
import json
from pathlib import Path
from typing import Any

from paritygate.check import Rendered
from paritygate.golden import atomic_write_bytes
from paritygate.result import CheckResult

CSV_COLUMNS = [
    "dtype", "index", "layer", "type", "kind", "budget_ulps", "budget",
    "local_rel_l2", "local_max_abs", "local_p99_abs", "local_cosine", "local_sqnr_db",
    "local_nan", "local_inf",
    "cum_rel_l2", "cum_max_abs", "cum_p99_abs", "cum_cosine", "cum_sqnr_db", "cum_nan", "cum_inf",
    "cum_in_rel_l2", "amplification", "headroom", "underflow_fraction", "numel",
    "over_budget", "local_error",
]  # fmt: skip


def write_csv(report: dict[str, Any], path: Path) -> Path:
    """One row per (dtype, layer), execution order within each dtype."""
    import io

    buffer = io.StringIO()
    writer = csv.DictWriter(
        buffer, fieldnames=CSV_COLUMNS, extrasaction="ignore", lineterminator="\n"
    )
    writer.writeheader()
    for row in report["rows"]:
        writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in CSV_COLUMNS})
    atomic_write_bytes(path, buffer.getvalue().encode())
    return path


def write_json(report: dict[str, Any], path: Path) -> Path:
    atomic_write_bytes(path, json.dumps(report, indent=1, sort_keys=False).encode())
    return path


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return "-" if value is None else str(value)


def markdown_table(report: dict[str, Any]) -> str:
    """Per dtype: output error vs budget, first divergent layer, fp32 suggestion; worst layers."""
    lines = [
        "| dtype | output rel L2 | output budget | layers over budget | first divergent layer "
        "| keep in fp32 |",
        "|---|---|---|---|---|---|",
    ]
    for dtype, s in report["summary"].items():
        first = s["first_divergent"]
        mixed = s.get("mixed")
        keep = (
            "-"
            if not mixed
            else (", ".join(mixed["keep_fp32"]) or "-")
            + ("" if mixed["verified"] else " (not verified)")
        )
        lines.append(
            f"| {dtype} | {_fmt(s['output_rel_l2'])} | {_fmt(s['output_budget'])} | "
            f"{s['layers_over_budget']} | {first['layer'] if first else '-'} | {keep} |"
        )
    onnx = report.get("onnx")
    if onnx:
        first = onnx["first_divergent"]
        lines.append("")
        lines.append(
            f"ONNX ({onnx['dtype']}): output rel L2 {_fmt(onnx['output_rel_l2'])} "
            f"(budget {_fmt(onnx['output_budget'])}), {len(onnx['rows'])} layers compared, "
            f"{len(onnx['unmapped'])} unmapped, first divergent: {first['layer'] if first else '-'}"
        )
    def ratio(row: dict[str, Any]) -> float:
        value = row["local_rel_l2"]
        return float(value) / float(row["budget"]) if value is not None else 0.0

    worst = sorted(report["rows"], key=lambda r: (-ratio(r), r["index"]))[:5]
    if worst:
        lines += [
            "",
            "| dtype | layer | local rel L2 | budget | cumulative rel L2 | amplification |",
            "|---|---|---|---|---|---|",
        ]
        for r in worst:
            cells = [r["dtype"], r["layer"], _fmt(r["local_rel_l2"]), _fmt(r["budget"]),
                     _fmt(r["cum_rel_l2"]), _fmt(r["amplification"])]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_precision(result: CheckResult, report_dir: Path) -> Rendered:
    """Write precision_layers.csv, precision.json and precision.png; return the fragments."""
    report = result.details.get("precision")
    if not report:
        return Rendered()
    from paritygate.precision.plot import plot_precision

    report_dir = Path(report_dir)
    csv_path = write_csv(report, report_dir / "precision_layers.csv")
    json_path = write_json(report, report_dir / "precision.json")
    png_path = plot_precision(report, report_dir / "precision.png")
    table = markdown_table(report)
    encoded = base64.b64encode(png_path.read_bytes()).decode()
    fragment = (
        '<section class="precision"><h3>Per-layer precision</h3>'
        f"<pre>{html.escape(table)}</pre>"
        f'<img alt="per-layer precision error" src="data:image/png;base64,{encoded}"/>'
        f"<p>{html.escape(report['budget_formula'])}</p></section>"
    )
    return Rendered(
        markdown=table,
        html=fragment,
        files=[str(csv_path), str(json_path), str(png_path)],
    )
