"""Plots embedded in report.html (PNG, base64): LM log-prob delta histogram and delta per
position, drawn from the ``per_token`` details of ``logprob_delta`` / ``vllm_delta``, and
rollout_parity's per-step action difference and cumulative returns.

matplotlib is optional (the ``plots`` extra): without it the report has no plots.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import TYPE_CHECKING

from paritygate.checks._delta_records import PerToken, TokenDelta
from paritygate.result import CheckResult

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from paritygate.checks.rollout_parity import EpisodeCurve

LM_DELTA_CHECKS = ("logprob_delta", "vllm_delta")


def _png(fig: Figure) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)  # fixed margins: no extra measuring draw
    return base64.b64encode(buffer.getvalue()).decode()


def _figure() -> Figure:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.5, 3.2))
    fig.subplots_adjust(left=0.14, right=0.97, top=0.9, bottom=0.15)
    return fig


def lm_delta_plots(result: CheckResult) -> list[dict[str, str]]:
    """``[{"title", "png"}]``: histogram of per-token deltas and delta against position."""
    if result.id not in LM_DELTA_CHECKS:
        return []
    record = PerToken.read(result.details)
    tokens = [t for t in (record.per_token if record is not None else [])
              if isinstance(t, TokenDelta) and isinstance(t.delta, (int, float))]
    if not tokens:
        return []
    try:
        import matplotlib.figure  # noqa: F401 - no pyplot: no GUI backend, no global state
    except ImportError:
        return []
    import numpy as np

    delta = np.array([t.delta for t in tokens], dtype=np.float64)
    pos = np.array([t.pos for t in tokens], dtype=np.int64)
    delta = np.where(np.isfinite(delta), delta, np.nan)
    shown = delta[np.isfinite(delta)]
    out = []
    fig = _figure()
    ax = fig.subplots()
    ax.hist(shown, bins=min(60, max(10, shown.size // 4)) if shown.size else 10, color="#4063a0")
    ax.set_xlabel("log-prob delta (trainer - engine), nats")
    ax.set_ylabel("tokens")
    ax.set_title(f"{result.id}: delta histogram ({shown.size} tokens)")
    out.append({"title": "delta histogram", "png": _png(fig)})
    fig = _figure()
    ax = fig.subplots()
    ax.scatter(pos, delta, s=6, alpha=0.5, color="#4063a0", label="token")
    positions = np.unique(pos)
    worst = [np.nanmax(np.abs(delta[pos == p])) if np.isfinite(delta[pos == p]).any()
             else np.nan for p in positions]
    ax.plot(positions, worst, color="#b00020", linewidth=1, label="max |delta|")
    threshold = result.thresholds.get("delta_max_abs") if result.thresholds else None
    if isinstance(threshold, (int, float)):
        ax.axhline(threshold, color="#777", linestyle="--", linewidth=1, label="threshold")
        ax.axhline(-threshold, color="#777", linestyle="--", linewidth=1)
    ax.set_xlabel("response position")
    ax.set_ylabel("delta, nats")
    ax.set_title(f"{result.id}: delta per position")
    ax.legend(fontsize=7)
    out.append({"title": "delta per position", "png": _png(fig)})
    return out


def rollout_figure(curves: list[EpisodeCurve], path: Path, title: str) -> Path | None:
    """rollout_parity's figure at ``path``: per-step action difference (top) and both paths'
    cumulative return (bottom), one colour per episode; ``None`` without matplotlib."""
    try:
        from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global state
    except ImportError:
        return None
    from paritygate.files import atomic_savefig

    fig = Figure(figsize=(7.0, 5.0))
    top, bottom = fig.subplots(2, 1, sharex=True)
    colours = [f"C{i % 10}" for i in range(len(curves))]
    for curve, colour in zip(curves, colours, strict=True):
        label = f"ep {curve.episode} (seed {curve.seed})"
        diff = curve.action_diff
        at = curve.first_divergent_step
        # compared up to the first divergence; after it the paths see other states (faint)
        cut = len(diff) if at is None else at + 1
        top.step(range(cut), diff[:cut], where="post", color=colour, label=label,
                 linewidth=1.2)
        if at is not None:
            top.plot([at], [diff[at]], marker="x", color=colour, markersize=8)
            top.step(range(at, len(diff)), diff[at:], where="post", color=colour,
                     linewidth=0.8, alpha=0.25)
        for series, style, face in ((curve.training_return, "-", colour),
                                    (curve.artifact_return, "--", "white")):
            bottom.plot(series, color=colour, linewidth=1.2, linestyle=style)
            if series:  # the episode's end
                bottom.plot([len(series) - 1], [series[-1]], marker="o", color=colour,
                            markerfacecolor=face, markersize=5)
    top.set_ylabel("action difference")
    top.set_title(f"{title} (x: first divergent step; faint: not compared)")
    top.legend(fontsize=7, loc="upper right")
    bottom.set_ylabel("cumulative return")
    bottom.set_xlabel("step")
    bottom.plot([], [], color="black", label="training path")
    bottom.plot([], [], color="black", linestyle="--", label="artifact")
    bottom.legend(fontsize=7, loc="upper left")
    fig.subplots_adjust(left=0.11, right=0.97, top=0.93, bottom=0.1, hspace=0.12)
    return atomic_savefig(fig, path, dpi=90)
