"""Report artifacts of the precision check: CSV, JSON, PNG, and Markdown/HTML fragments."""

from __future__ import annotations

import base64
import csv
import html
import json
from pathlib import Path
from typing import Any

from paritygate.files import atomic_write_bytes
from paritygate.fragments import Rendered
from paritygate.precision.report import LayerRow, PrecisionDetails, PrecisionReport
from paritygate.precision.stats import json_number
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


ROW_COLUMNS = CSV_COLUMNS[: CSV_COLUMNS.index("onnx_dtype")]
"""The columns a torch row holds (:class:`~paritygate.precision.report.LayerRow` fields)."""


def _cell(value: object) -> object:
    return "" if value is None else value


def _onnx_cells(report: PrecisionReport) -> dict[str, list[object]]:
    """``{layer: onnx_* cells}`` from the ONNX comparison, if one ran."""
    onnx = report.onnx
    if onnx is None:
        return {}
    return {
        r.layer: [onnx.dtype, r.onnx_value, json_number(r.onnx_rel_l2), json_number(r.onnx_max_abs),
                  r.onnx_nan, r.onnx_inf, json_number(r.budget), r.over_budget]
        for r in onnx.rows
    }  # fmt: skip


def write_csv(report: PrecisionReport, path: Path) -> Path:
    """One row per (dtype, layer), execution order within each dtype."""
    import io

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    onnx = _onnx_cells(report)
    blank = [None] * (len(CSV_COLUMNS) - len(ROW_COLUMNS))
    for row in report.rows:
        cells = [_number_cell(getattr(row, name)) for name in ROW_COLUMNS]
        writer.writerow([_cell(c) for c in cells + onnx.get(row.layer, blank)])
    atomic_write_bytes(path, buffer.getvalue().encode())
    return path


def _number_cell(value: object) -> object:
    return json_number(value) if isinstance(value, float) else value


def write_json(report: PrecisionReport, path: Path) -> Path:
    atomic_write_bytes(path, json.dumps(report.to_json(), indent=1, sort_keys=False).encode())
    return path


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return "-" if value is None else str(value)


Block = tuple[str, Any]
"""``("table", (header, rows))`` or ``("text", paragraph)``: rendered as Markdown or HTML."""


def summary_blocks(report: PrecisionReport) -> list[Block]:
    """Per dtype: output error vs budget, first divergent layer, fp32 suggestion; the ONNX
    output as served and as read in the marked copy; the five layers furthest over budget."""
    rows = []
    for dtype, s in report.summary.items():
        first = s.first_divergent
        mixed = s.mixed
        keep = (
            "-"
            if not mixed
            else (", ".join(mixed.keep_fp32) or "-") + ("" if mixed.verified else " (not verified)")
        )
        rows.append(
            [
                dtype,
                _fmt(s.output_rel_l2),
                _fmt(s.output_budget),
                str(s.layers_over_budget),
                first.layer if first else "-",
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
    if any(s.mixed for s in report.summary.values()):
        blocks.append(("text", MIXED_ASSUMPTION))
    onnx = report.onnx
    if onnx:
        first_onnx = onnx.first_divergent
        marked = f" (row {onnx.marked_output_row})" if onnx.marked_output_row else ""
        text = (
            f"ONNX ({onnx.dtype}): output rel L2 {_fmt(onnx.output_rel_l2)} as served "
            f"(budget {_fmt(onnx.output_budget)}; judged), "
            f"{_fmt(onnx.marked_output_rel_l2)} in the copy with intermediates marked as "
            f"outputs{marked}; {len(onnx.rows)} layers compared, {len(onnx.unmapped)} "
            f"unmapped, first divergent: {first_onnx.layer if first_onnx else '-'}"
        )
        blocks.append(("text", text))
        if onnx.marking_note:
            blocks.append(("text", f"{onnx.marking_note}."))

    def ratio(row: LayerRow) -> float:
        return row.local_rel_l2 / row.budget

    worst = sorted(report.rows, key=lambda r: (-ratio(r), r.index))[:5]
    if worst:
        header = ["dtype", "layer", "local rel L2", "budget", "cumulative rel L2", "amplification"]
        cells = [
            [
                r.dtype,
                r.layer,
                _fmt(r.local_rel_l2),
                _fmt(r.budget),
                _fmt(r.cum_rel_l2),
                _fmt(r.amplification),
            ]
            for r in worst
        ]
        blocks.append(("table", (header, cells)))
    return blocks


def markdown_table(report: PrecisionReport) -> str:
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


def html_tables(report: PrecisionReport) -> str:
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


def render_precision(result: CheckResult, report_dir: Path, *, figures: bool = True
                     ) -> Rendered:
    """Write precision_layers.csv, precision.json and (with ``figures``) precision.png;
    return the fragments."""
    record = PrecisionDetails.read(result.details)
    if record is None:
        return Rendered()
    report = record.precision
    report_dir = Path(report_dir)
    csv_path = write_csv(report, report_dir / "precision_layers.csv")
    json_path = write_json(report, report_dir / "precision.json")
    written = [csv_path, json_path]
    image = ""
    if figures:
        from paritygate.precision.plot import plot_precision

        png_path = plot_precision(report, report_dir / "precision.png")
        written.append(png_path)
        encoded = base64.b64encode(png_path.read_bytes()).decode()
        image = f'<img alt="per-layer precision error" src="data:image/png;base64,{encoded}"/>'
    else:  # an earlier run's figure would not be this run's
        (report_dir / "precision.png").unlink(missing_ok=True)
    table = markdown_table(report)
    notes = [str(n) for n in report.notes]
    if notes:
        table += "\n\n" + "\n".join(f"- {n}" for n in notes)
    names = ", ".join(Path(p).name for p in written)
    fragment = (
        '<section class="precision"><h3>Per-layer precision</h3>'
        f"{image}"
        f"{html_tables(report)}"
        + ("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>" if notes else "")
        + f"<p>{html.escape(report.budget_formula)}</p>"
        f"<p>Every layer's numbers: {html.escape(names)} beside this report; the per-layer "
        "golden baseline: precision_per_layer.detail.json beside the golden file.</p></section>"
    )
    return Rendered(
        markdown=table,
        html=fragment,
        files=[str(p) for p in written],
    )
