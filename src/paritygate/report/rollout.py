"""rollout_parity's report fragments: a table per episode and the per-step figure."""

from __future__ import annotations

import base64
from pathlib import Path

from paritygate.checks.rollout_parity import EpisodeRow, RolloutRecord
from paritygate.fragments import Rendered
from paritygate.report.plots import rollout_figure
from paritygate.report.render import render_fragment, table_html, table_markdown
from paritygate.result import CheckResult

PLOT = "rollout_parity.png"
HEADER = ["episode", "seed", "return (training / artifact)", "length (training / artifact)",
          "first divergent step", "margin", "actions there", "verdict"]


def _num(v: object) -> str:
    return "-" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))


def episode_cells(rows: list[EpisodeRow]) -> list[list[str]]:
    """One table row per episode (:class:`~paritygate.checks.rollout_parity.EpisodeRow`)."""
    return [[
        str(r.episode), str(r.seed),
        f"{_num(r.training_return)} / {_num(r.artifact_return)}",
        f"{r.training_length} / {r.artifact_length}",
        _num(r.first_divergent_step), _num(r.margin),
        (f"{r.training_action} / {r.artifact_action}" if r.training_action is not None
         else "-"),
        str(r.verdict),
    ] for r in rows]


def render_rollout(result: CheckResult, report_dir: Path, *, figures: bool = True) -> Rendered:
    """rollout_parity.png (per-step action difference and cumulative return of both paths;
    with ``figures``) and a table per episode, for report.md and report.html."""
    record = RolloutRecord.read(result.details)
    if record is None or not record.episodes:
        return Rendered()
    cells = episode_cells(record.episodes)
    title = f"rollout_parity: {record.env}"
    png = (rollout_figure(record.curves, Path(report_dir) / PLOT, title)
           if figures else None)
    if not figures:  # an earlier run's figure would not be this run's
        (Path(report_dir) / PLOT).unlink(missing_ok=True)
    encoded = base64.b64encode(png.read_bytes()).decode() if png is not None else ""
    fragment = render_fragment("rollout.html.j2", png=encoded, table=table_html(HEADER, cells))
    return Rendered(markdown=table_markdown(HEADER, cells), html=fragment,
                    files=[str(png)] if png is not None else [])
