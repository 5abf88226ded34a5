"""Report artifacts of the precision check: CSV, JSON, PNG, and Markdown/HTML fragments."""

from __future__ import annotations

import base64
import csv
import html
import json
from pathlib import Path
from typing import Any

from paritygate.check import Rendered
from paritygate.files import atomic_write_bytes
from paritygate.result import CheckResult

CSV_COLUMNS = [
    "dtype", "index", "layer", "type", "kind", "budget_ulps", "budget",
    "local_rel_l2", "local_max_abs", "local_p99_abs", "local_cosine", "local_sqnr_db",
    "local_nan", "local_inf",
    "cum_rel_l2", "cum_max_abs", "cum_p99_abs", "cum_cosine", "cum_sqnr_db", "cum_nan", "cum_inf",
    "cum_in_rel_l2", "amplification", "headroom", "underflow_fraction", "numel",
    "over_budget", "local_error", "input_beyond_range",
    "onnx_dtype", "onnx_value", "onnx_rel_l2", "onnx_max_abs", "onnx_nan", "onnx_inf",
    "onnx_budget", "onnx_over_budget",
]  # fmt: skip
"""Torch rows per (dtype, layer); the ``onnx_*`` columns hold the ONNX artifact's tensor of
that layer against torch fp32 (independent of the torch dtype, so the same on each dtype's
row; empty where the layer has no ONNX tensor or no comparison ran)."""

MIXED_ASSUMPTION = (
    "Mixed-precision suggestions are verified the way a runtime runs a graph with some nodes "
    "pinned to fp32: activations are handed between modules in the low dtype, a kept layer "
    "computes in fp32 on upcast inputs and downcasts its output. Assumption: the runtime keeps "
    "the tensors between nodes in the low dtype."
)


def _onnx_cells(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{layer: onnx_* cells}`` from the ONNX comparison, if one ran."""
    onnx = report.get("onnx")
    if not onnx:
        return {}
    return {
        r["layer"]: {
            "onnx_dtype": onnx["dtype"], "onnx_value": r["onnx_value"],
            "onnx_rel_l2": r["onnx_rel_l2"], "onnx_max_abs": r["onnx_max_abs"],
            "onnx_nan": r["onnx_nan"], "onnx_inf": r["onnx_inf"],
            "onnx_budget": r["budget"], "onnx_over_budget": r["over_budget"],
        }
        for r in onnx["rows"]
    }  # fmt: skip


def write_csv(report: dict[str, Any], path: Path) -> Path:
    """One row per (dtype, layer), execution order within each dtype."""
    import io

    buffer = io.StringIO()
    writer = csv.DictWriter(
        buffer, fieldnames=CSV_COLUMNS, extrasaction="ignore", lineterminator="\n"
    )
    writer.writeheader()
    onnx = _onnx_cells(report)
    for row in report["rows"]:
        full = {**row, **onnx.get(row["layer"], {})}
        writer.writerow({k: ("" if full.get(k) is None else full.get(k)) for k in CSV_COLUMNS})
    atomic_write_bytes(path, buffer.getvalue().encode())
    return path


def write_json(report: dict[str, Any], path: Path) -> Path:
    atomic_write_bytes(path, json.dumps(report, indent=1, sort_keys=False).encode())
    return path


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return "-" if value is None else str(value)


Block = tuple[str, Any]
"""``("table", (header, rows))`` or ``("text", paragraph)``: rendered as Markdown or HTML."""


def summary_blocks(report: dict[str, Any]) -> list[Block]:
    """Per dtype: output error vs budget, first divergent layer, fp32 suggestion; the ONNX
    output as served and as read in the marked copy; the five layers furthest over budget."""
    rows = []
    for dtype, s in report["summary"].items():
        first = s["first_divergent"]
        mixed = s.get("mixed")
        keep = (
            "-"
            if not mixed
            else (", ".join(mixed["keep_fp32"]) or "-")
            + ("" if mixed["verified"] else " (not verified)")
        )
        rows.append(
            [
                dtype,
                _fmt(s["output_rel_l2"]),
                _fmt(s["output_budget"]),
                str(s["layers_over_budget"]),
                first["layer"] if first else "-",
                keep,
            ]
        )
    header = [
        "dtype",
        "output rel L2",
        "output budget",
        "layers over budget",
        "first divergent layer",
        "keep in fp32",
    ]
    blocks: list[Block] = [("table", (header, rows))]
    if any(s.get("mixed") for s in report["summary"].values()):
        blocks.append(("text", MIXED_ASSUMPTION))
    onnx = report.get("onnx")
    if onnx:
        first = onnx["first_divergent"]
        row = onnx.get("marked_output_row")
        marked = f" (row {row})" if row else ""
        text = (
            f"ONNX ({onnx['dtype']}): output rel L2 {_fmt(onnx['output_rel_l2'])} as served "
            f"(budget {_fmt(onnx['output_budget'])}; judged), "
            f"{_fmt(onnx.get('marked_output_rel_l2'))} in the copy with intermediates marked as "
            f"outputs{marked}; {len(onnx['rows'])} layers compared, {len(onnx['unmapped'])} "
            f"unmapped, first divergent: {first['layer'] if first else '-'}"
        )
        blocks.append(("text", text))
        if onnx.get("marking_note"):
            blocks.append(("text", f"{onnx['marking_note']}."))

    def ratio(row: dict[str, Any]) -> float:
        value = row["local_rel_l2"]
        return float(value) / float(row["budget"]) if value is not None else 0.0

    worst = sorted(report["rows"], key=lambda r: (-ratio(r), r["index"]))[:5]
    if worst:
        header = ["dtype", "layer", "local rel L2", "budget", "cumulative rel L2", "amplification"]
        cells = [
            [
                r["dtype"],
                r["layer"],
                _fmt(r["local_rel_l2"]),
                _fmt(r["budget"]),
                _fmt(r["cum_rel_l2"]),
                _fmt(r["amplification"]),
            ]
            for r in worst
        ]
        blocks.append(("table", (header, cells)))
    return blocks


def markdown_table(report: dict[str, Any]) -> str:
    """The summary blocks as Markdown (report.md, the terminal)."""
    out = []
    for kind, body in summary_blocks(report):
        if kind == "text":
            out.append(body)
            continue
        header, rows = body
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        out.append("\n".join(lines))
    return "\n\n".join(out)


def html_tables(report: dict[str, Any]) -> str:
    """The summary blocks as HTML tables and paragraphs (report.html)."""
    out = []
    for kind, body in summary_blocks(report):
        if kind == "text":
            out.append(f"<p>{html.escape(body)}</p>")
            continue
        header, rows = body
        head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
        cells = "".join(
            "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows
        )
        out.append(f"<table><tr>{head}</tr>{cells}</table>")
    return "".join(out)


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
    notes = [str(n) for n in report.get("notes") or []]
    if notes:
        table += "\n\n" + "\n".join(f"- {n}" for n in notes)
    encoded = base64.b64encode(png_path.read_bytes()).decode()
    names = ", ".join(Path(p).name for p in (csv_path, json_path, png_path))
    fragment = (
        '<section class="precision"><h3>Per-layer precision</h3>'
        f'<img alt="per-layer precision error" src="data:image/png;base64,{encoded}"/>'
        f"{html_tables(report)}"
        + ("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>" if notes else "")
        + f"<p>{html.escape(report['budget_formula'])}</p>"
        f"<p>Every layer's numbers: {html.escape(names)} beside this report; the per-layer "
        "golden baseline: precision_per_layer.detail.json beside the golden file.</p></section>"
    )
    return Rendered(
        markdown=table,
        html=fragment,
        files=[str(csv_path), str(json_path), str(png_path)],
    )
