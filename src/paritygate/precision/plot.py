"""precision.png: every per-layer series that can decide the verdict, leaves and blocks apart.

Panels share the x axis (execution order): leaf modules, blocks (modules with
children), and overflow headroom. Leaves and blocks are separate series so a
line never zigzags between a Linear and the block around it. Per dtype: local
error (solid), cumulative error (dotted), the local budget (dashed steps); the
ONNX artifact's tensors against torch fp32 (black) with their own budget. A
non-finite value is a red triangle at the top of its panel, never a line point.
The worst layers (largest error over budget, non-finite first) are named on the
x axis.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from paritygate.files import atomic_savefig
from paritygate.precision.report import LayerRow, OnnxRow, PrecisionReport

if TYPE_CHECKING:
    from matplotlib.axes import Axes

COLOURS = {"float16": "tab:blue", "bfloat16": "tab:orange"}
ONNX_COLOUR = "black"
NONFINITE_COLOUR = "red"
NAMED = 10
"""How many of the worst layers are named on the x axis."""


def _number(v: float | str | None) -> float | None:
    """A finite float, ``None`` for missing, ``math.inf`` for NaN/Inf (strings in the JSON)."""
    if v is None:
        return None
    try:
        value = float(v)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else math.inf


def _ratio(value: float | str | None, budget: float | str | None) -> float:
    v, b = _number(value), _number(budget)
    if v is None:
        return 0.0
    if math.isinf(v):
        return math.inf
    return v / b if b else 0.0


def _series(rows: Sequence[LayerRow | OnnxRow], key: str, floor: float
            ) -> tuple[list[int], list[float], list[int]]:
    """(x, y with gaps at non-finite values, x of the non-finite values)."""
    xs: list[int] = []
    ys: list[float] = []
    bad: list[int] = []
    for r in rows:
        v = _number(getattr(r, key))
        if v is None:
            continue
        xs.append(r.index)
        if math.isinf(v):
            ys.append(math.nan)  # a gap in the line; drawn as a marker instead
            bad.append(r.index)
        else:
            ys.append(max(v, floor))
    return xs, ys, bad


def _worst(report: PrecisionReport, min_gap: float = 0.0) -> list[tuple[int, str]]:
    """(index, layer) of the layers furthest over their budget in any series, each at least
    ``min_gap`` indices from a worse one (slanted names closer than that overlap)."""
    score: dict[tuple[int, str], float] = {}
    for r in report.rows:
        k = (r.index, r.layer)
        score[k] = max(score.get(k, 0.0), _ratio(r.local_rel_l2, r.budget))
    for o in report.onnx.rows if report.onnx else []:
        k = (o.index, o.layer)
        score[k] = max(score.get(k, 0.0), _ratio(o.onnx_rel_l2, o.budget))
    named: list[tuple[int, str]] = []
    for k in sorted(score, key=lambda k: (-score[k], k[0])):
        if len(named) == NAMED:
            break
        if all(abs(k[0] - i) >= min_gap for i, _ in named):
            named.append(k)
    return sorted(named)


def plot_precision(report: PrecisionReport, path: Path) -> Path:
    """Write ``precision.png`` from a precision report (see :mod:`~.analysis`)."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global figure state

    rows = report.rows
    floor = 1e-12
    kinds = [k for k in ("leaf", "block") if any(r.kind == k for r in rows)]
    title = _title(report)
    indices = [r.index for r in rows] or [0]
    span = max(indices) - min(indices) + 1
    axis_in = 12 * (0.8 - 0.08)
    named = _worst(report, min_gap=0.2 * span / axis_in)  # names 0.2 in apart at least
    longest = max((len(name) for _, name in named), default=0)
    # title lines; names slanted at 35 degrees (7 pt: about 0.053 in a character) + axis label
    top_in, bottom_in = 0.3 + 0.16 * title.count("\n"), 0.55 + 0.031 * longest
    height = 3.2 * len(kinds) + 1.1 + bottom_in
    fig = Figure(figsize=(12, height), dpi=100)
    # Fixed margins in inches, not tight_layout: it draws the figure once more to measure.
    fig.subplots_adjust(left=0.08, right=0.8, top=1 - top_in / height, bottom=bottom_in / height,
                        hspace=0.12)
    axes = fig.subplots(
        len(kinds) + 1, 1, sharex=True, gridspec_kw={"height_ratios": [3] * len(kinds) + [1.6]}
    )
    axes = list(axes)
    for ax, k in zip(axes, kinds, strict=False):
        _error_panel(ax, report, k, floor)
    _headroom_panel(axes[-1], report, named)
    axes[0].set_title(title, fontsize=9, loc="left")
    return atomic_savefig(fig, path)  # a reader polling the report folder never sees a partial PNG


def _error_panel(ax: Axes, report: PrecisionReport, k: str, floor: float) -> None:
    """One panel of layers of kind ``k`` (leaf or block): per dtype the local and cumulative
    error and the local budget, the ONNX artifact's tensors, non-finite values marked."""
    rows = report.rows
    onnx = report.onnx
    kind = {r.layer: r.kind for r in rows}
    bad_x: list[int] = []
    for dtype in report.dtypes:
        if report.summary[dtype].error:
            continue
        colour = COLOURS.get(dtype)
        mine = sorted(
            (r for r in rows if r.dtype == dtype and r.kind == k),
            key=lambda r: r.index,
        )
        x, y, bad = _series(mine, "local_rel_l2", floor)
        ax.plot(x, y, "-o", ms=3, lw=1.2, color=colour, label=f"{dtype} local")
        bad_x += bad
        x, y, bad = _series(mine, "cum_rel_l2", floor)
        ax.plot(x, y, ":", lw=1.2, color=colour, label=f"{dtype} cumulative")
        bad_x += bad
        ax.step(
            [r.index for r in mine],
            [r.budget for r in mine],
            where="mid",
            marker="_",
            ms=10,
            color=colour,
            alpha=0.5,
            lw=1,
            ls="--",
            label=f"{dtype} local budget",
        )
        first = report.summary[dtype].first_divergent
        if first is not None and kind.get(first.layer) == k:
            ax.axvline(
                first.index,
                color=colour,
                alpha=0.5,
                lw=2,
                ls="-.",
                label=f"{dtype} first divergent (title)",
            )
    theirs = sorted(
        (r for r in onnx.rows if kind.get(r.layer) == k) if onnx else [], key=lambda r: r.index
    )
    if onnx and theirs:
        x, y, bad = _series(theirs, "onnx_rel_l2", floor)
        ax.plot(
            x,
            y,
            "-s",
            ms=3,
            lw=1.2,
            color=ONNX_COLOUR,
            label=f"ONNX artifact ({onnx.dtype}) vs torch fp32",
        )
        bad_x += bad
        ax.step(
            x,
            [r.budget for r in theirs],
            where="mid",
            color=ONNX_COLOUR,
            alpha=0.4,
            lw=1,
            ls="--",
            label="ONNX budget",
        )
    _log_axis(ax)
    if bad_x:
        top = ax.get_ylim()[1]
        ax.plot(
            sorted(set(bad_x)),
            [top] * len(set(bad_x)),
            "^",
            ms=8,
            clip_on=False,
            color=NONFINITE_COLOUR,
            label="NaN/Inf (non-finite)",
        )
        ax.set_ylim(top=top)
    ax.set_ylabel(f"rel L2 vs fp32\n({'leaf modules' if k == 'leaf' else 'blocks'})")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def _headroom_panel(head: Axes, report: PrecisionReport, named: list[tuple[int, str]]) -> None:
    """The bottom panel: overflow headroom per dtype, the worst layers named on the x axis."""
    for dtype in report.dtypes:
        if report.summary[dtype].error:
            continue
        mine = sorted(report.dtype_rows(dtype), key=lambda r: r.index)
        x, y, _ = _series(mine, "headroom", 1e-8)  # far below the limit: drawn at 1e-8
        head.plot(x, y, ".", ms=4, color=COLOURS.get(dtype), label=f"{dtype} headroom")
    if report.headroom_max is not None:
        head.axhline(
            report.headroom_max, color=NONFINITE_COLOUR, ls="--", lw=1, label="headroom limit"
        )
    _log_axis(head)
    head.set_ylabel("max |activation| /\nformat max")
    head.grid(True, which="major", alpha=0.3)
    head.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    head.set_xticks([i for i, _ in named])
    head.set_xticklabels([name for _, name in named], rotation=35, ha="right", fontsize=7)
    head.set_xlabel(f"layer (execution order; the {len(named)} highest error / budget named)")


def _log_axis(ax: Axes) -> None:
    """Log y axis labelled ``1e-05`` in plain text (mathtext labels cost a parser per tick)."""
    from matplotlib.ticker import LogFormatter, NullFormatter

    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(LogFormatter(labelOnlyBase=True))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _title(report: PrecisionReport) -> str:
    """The output errors (what the verdict judges first), one line per source."""
    parts = []
    for dtype, s in report.summary.items():
        if s.error:
            parts.append(f"{dtype}: skipped")
            continue
        first = s.first_divergent
        parts.append(
            f"{dtype} output rel L2 {_fmt(s.output_rel_l2)} (budget {_fmt(s.output_budget)})"
            + (f", first divergent {first.layer}" if first else "")
        )
    onnx = report.onnx
    if onnx:
        parts.append(
            f"ONNX output {_fmt(onnx.output_rel_l2)} as served, "
            f"{_fmt(onnx.marked_output_rel_l2)} with intermediates marked "
            f"(budget {_fmt(onnx.output_budget)})"
        )
    return "per-layer precision error\n" + "\n".join(parts)


def _fmt(value: float | str | None) -> str:
    v = _number(value)
    return "-" if v is None else ("nan/inf" if math.isinf(v) else f"{v:.3g}")
