"""Error per layer in execution order per dtype, log scale, budgets and divergence marked."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

COLOURS = {"float16": "tab:blue", "bfloat16": "tab:orange"}


def _value(v: Any, ceiling: float) -> float:
    """Plot value: non-finite errors drawn at the top of the axis, zero at the bottom."""
    if isinstance(v, str) or v is None:
        return ceiling
    return max(float(v), 1e-12) if math.isfinite(v) else ceiling


def plot_precision(report: dict[str, Any], path: Path) -> Path:
    """Write ``precision.png``: local (solid) and cumulative (dotted) rel L2 error per layer."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global figure state

    rows = report["rows"]
    finite = [
        float(r[k])
        for r in rows
        for k in ("local_rel_l2", "cum_rel_l2", "budget")
        if isinstance(r[k], (int, float)) and math.isfinite(r[k]) and r[k] > 0
    ]
    ceiling = max(finite, default=1.0) * 10
    width = min(max(8.0, 0.12 * (len(rows) / max(len(report["dtypes"]), 1)) + 6), 32.0)
    fig = Figure(figsize=(width, 4.5), dpi=100)
    ax = fig.subplots()
    labels: list[str] = []
    for dtype in report["dtypes"]:
        colour = COLOURS.get(dtype)
        mine = sorted((r for r in rows if r["dtype"] == dtype), key=lambda r: r["index"])
        if not mine:
            continue
        labels = [r["layer"] for r in mine]
        x = [r["index"] for r in mine]
        ax.plot(
            x,
            [_value(r["local_rel_l2"], ceiling) for r in mine],
            "-o",
            ms=3,
            color=colour,
            label=f"{dtype} local",
        )
        ax.plot(
            x,
            [_value(r["cum_rel_l2"], ceiling) for r in mine],
            ":",
            color=colour,
            label=f"{dtype} cumulative",
        )
        ax.step(
            x,
            [r["budget"] for r in mine],
            where="mid",
            color=colour,
            alpha=0.5,
            lw=1,
            linestyle="--",
            label=f"{dtype} budget",
        )
        first = report["summary"][dtype]["first_divergent"]
        if first is not None:
            ax.axvline(first["index"], color=colour, alpha=0.6, lw=1.5)
            ax.annotate(
                f"first divergent ({dtype}): {first['layer']}",
                (first["index"], ceiling),
                xytext=(4, -12),
                textcoords="offset points",
                fontsize=8,
                color=colour,
            )
    ax.set_yscale("log")
    ax.set_ylabel("relative L2 error vs fp32")
    ax.set_xlabel("layer (execution order)")
    if len(labels) <= 60:
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=90, fontsize=6)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title("per-layer precision error")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path
