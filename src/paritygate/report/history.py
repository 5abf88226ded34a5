"""A training run's gate history as a page: each check's key metric across the saved
checkpoints, against its threshold, with the first failing step and its root cause marked.

The reports are the ones the run already wrote, one folder per checkpoint holding its
``report.json``: ``OUTPUT_DIR/paritygate/checkpoint-N/`` from the trainer callbacks
(``<save_path>/paritygate/<zip stem>/`` from SB3's), ``REPORT_DIR/checkpoint-N/`` from
``paritygate run --all``. :func:`write_history` writes ``history.html`` beside those folders (the
plots embedded, each step linked to its checkpoint's ``report.html``) and one PNG per check in
``history/``. Every report is read through :mod:`paritygate.reading`; a folder without one is
bad input.
"""

from __future__ import annotations

import base64
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from paritygate.errors import InputError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["CheckPoint", "RunHistory", "StepReport", "read_history", "write_history"]

_STEP_IN_NAME = re.compile(r"(\d+)")


@dataclass(frozen=True)
class CheckPoint:
    """One check's key metric at one step."""

    status: str
    metric: str | None
    value: float | None
    threshold: float | None


@dataclass(frozen=True)
class StepReport:
    """One checkpoint's gate: its step, folder, verdict, root cause and each check's point."""

    step: int
    folder: Path
    status: str
    root_check: str | None
    root_kind: str | None
    checks: dict[str, CheckPoint] = field(default_factory=dict)

    @property
    def root(self) -> str | None:
        """``check: kind`` of the root cause, if the gate named one."""
        return f"{self.root_check}: {self.root_kind}" if self.root_check else None


@dataclass(frozen=True)
class RunHistory:
    """Every gated checkpoint of a run, in step order."""

    folder: Path
    """The folder holding the per-checkpoint report folders."""
    steps: list[StepReport]

    @property
    def first_failure(self) -> StepReport | None:
        return next((s for s in self.steps if s.status != "pass"), None)

    def check_ids(self) -> list[str]:
        """Checks in the order the reports list them (first seen first)."""
        seen: dict[str, None] = {}
        for step in self.steps:
            seen.update(dict.fromkeys(step.checks))
        return list(seen)


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _step(report: dict[str, object], folder: Path, steps_by_dir: dict[str, int]) -> int | None:
    """The step: the trainer's record in the report, the callbacks' metrics.jsonl, else the
    number in the folder's name (``checkpoint-6``, ``rl_model_2048_steps``)."""
    checkpoint = report.get("checkpoint")
    trainer = checkpoint.get("trainer") if isinstance(checkpoint, dict) else None
    if isinstance(trainer, dict) and isinstance(trainer.get("step"), int):
        return int(trainer["step"])
    if folder.name in steps_by_dir:
        return steps_by_dir[folder.name]
    numbers = _STEP_IN_NAME.findall(folder.name)
    return int(numbers[-1]) if numbers else None


def _callback_steps(folder: Path) -> dict[str, int]:
    """``{report folder name: step}`` from the callbacks' ``metrics.jsonl`` (SB3 names its
    zips by timestep, and the step is the trainer's)."""
    import json

    from paritygate.reading import read_text

    path = folder / "metrics.jsonl"
    if not path.is_file():
        return {}
    found: dict[str, int] = {}
    for line in read_text(path, None, what="callback metrics").splitlines():
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            continue
        checkpoint, step = record.get("checkpoint"), record.get("step")
        if isinstance(checkpoint, str) and isinstance(step, int):
            found[Path(checkpoint).stem if checkpoint.endswith(".zip")
                  else Path(checkpoint).name] = step
    return found


def _point(check: dict[str, object]) -> CheckPoint:
    metric = check.get("key_metric")
    metrics, thresholds = check.get("metrics"), check.get("thresholds")
    if not isinstance(metric, str):
        return CheckPoint(str(check.get("status")), None, None, None)
    value = _number(metrics.get(metric)) if isinstance(metrics, dict) else None
    threshold = _number(thresholds.get(metric)) if isinstance(thresholds, dict) else None
    return CheckPoint(str(check.get("status")), metric, value, threshold)


def history_folder(output_dir: Path) -> Path:
    """Where a run's per-checkpoint reports are: ``output_dir/paritygate`` when the callbacks
    wrote there, else ``output_dir`` itself."""
    nested = output_dir / "paritygate"
    return nested if nested.is_dir() else output_dir


def read_history(output_dir: str | Path) -> RunHistory:
    """Every ``*/report.json`` under the run's report folder, in step order. A folder with
    none (or that does not exist) is an :class:`InputError` naming it."""
    from paritygate.reading_text import read_json_object

    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        raise InputError(output_dir, None, "not a folder: give a training run's output_dir or "
                         "the report folder of paritygate run --all")
    folder = history_folder(output_dir)
    steps_by_dir = _callback_steps(folder)
    found: list[StepReport] = []
    for path in sorted(folder.glob("*/report.json")):
        report = read_json_object(path, None, what="gate report")
        step = _step(report, path.parent, steps_by_dir)
        if step is None:
            raise InputError(path, "checkpoint.trainer.step", "no step: the report names no "
                             "trainer checkpoint and its folder name holds no number")
        root = report.get("root_cause") or {}
        checks = {str(c.get("id")): _point(c) for c in report.get("checks") or []
                  if isinstance(c, dict)}
        found.append(StepReport(step, path.parent, str(report.get("status")),
                                root.get("check"), root.get("kind"), checks))
    if not found:
        raise InputError(folder, None, "no gate reports (*/report.json) in this folder: run "
                         "paritygate run --all, or train with a paritygate callback, first")
    return RunHistory(folder, sorted(found, key=lambda s: (s.step, s.folder.name)))


def _figure(history: RunHistory, check: str) -> Figure | None:
    """The key metric of ``check`` against step, its threshold dashed, failing steps red, the
    first failing step of the run marked with its root cause; ``None`` with nothing to plot."""
    from matplotlib.figure import Figure

    points = [(s, s.checks[check]) for s in history.steps if check in s.checks]
    shown = [(s.step, p.value, p.status) for s, p in points
             if p.value is not None and math.isfinite(p.value)]
    metric = next((p.metric for _, p in points if p.metric), None)
    if metric is None:
        return None
    fig = Figure(figsize=(6.0, 3.0))
    fig.subplots_adjust(left=0.13, right=0.97, top=0.86, bottom=0.17)
    ax = fig.subplots()
    ax.plot([x for x, _, _ in shown], [y for _, y, _ in shown], color="#4063a0", marker="o",
            lw=1.2)
    bad = [(x, y) for x, y, status in shown if status not in ("pass", "skip")]
    if bad:
        ax.scatter([x for x, _ in bad], [y for _, y in bad], color="#c0392b", zorder=3,
                   s=40, label="failed")
    nonfinite = [s.step for s, p in points if p.value is not None and not math.isfinite(p.value)]
    for x in nonfinite:
        ax.axvline(x, color="#c0392b", lw=0.8, ls=":")
    threshold = next((p.threshold for _, p in reversed(points) if p.threshold is not None), None)
    if threshold is not None:
        ax.axhline(threshold, color="#7f8c8d", ls="--", lw=1, label=f"threshold {threshold:g}")
    first = history.first_failure
    if first is not None:
        ax.axvline(first.step, color="#c0392b", lw=1, alpha=0.6)
        ax.annotate(f"first failure: step {first.step}\n{first.root or first.status}",
                    xy=(first.step, 1.0), xycoords=("data", "axes fraction"), fontsize=7,
                    ha="left", va="top", color="#c0392b", xytext=(3, -3),
                    textcoords="offset points")
    values = [y for _, y, _ in shown] + ([threshold] if threshold is not None else [])
    if values and min(values) > 0 and max(values) / min(values) > 100:
        ax.set_yscale("log")  # a metric far under its threshold, then far over it
    ax.set_title(f"{check}: {metric}", fontsize=9)
    ax.set_xlabel("step", fontsize=8)
    ax.tick_params(labelsize=7)
    if bad or threshold is not None:
        ax.legend(fontsize=7, loc="lower right")
    return fig


def write_history(output_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write ``history.html`` (default: beside the per-checkpoint report folders) and one PNG
    per check in ``history/`` next to it; returns the page's path."""
    import io

    from paritygate.files import atomic_write_bytes, atomic_write_text
    from paritygate.report.render import render_page

    history = read_history(output_dir)
    page = Path(out) if out is not None else history.folder / "history.html"
    plots: list[dict[str, str]] = []
    try:
        import matplotlib.figure  # noqa: F401 - no pyplot: no GUI backend
    except ImportError:
        matplotlib_missing = True
    else:
        matplotlib_missing = False
    for check in [] if matplotlib_missing else history.check_ids():
        fig = _figure(history, check)
        if fig is None:
            continue
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=90)
        png = page.parent / "history" / f"{check}.png"
        atomic_write_bytes(png, buffer.getvalue())
        plots.append({"check": check, "file": png.relative_to(page.parent).as_posix(),
                      "png": base64.b64encode(buffer.getvalue()).decode()})
    rows = [{"step": s.step, "status": s.status, "root": s.root or "",
             "link": _link(_page_of(s.folder), page.parent), "name": s.folder.name,
             "first": s is history.first_failure} for s in history.steps]
    first = history.first_failure
    atomic_write_text(page, render_page(
        "history.html.j2", title=f"paritygate history: {history.folder}", rows=rows,
        plots=plots, first=None if first is None else {"step": first.step, "root": first.root,
                                                        "status": first.status},
        no_plots=matplotlib_missing))
    return page


def _page_of(folder: Path) -> Path:
    """A step's report.html, else its report.md (a run that asked for no HTML page), else
    report.json."""
    for name in ("report.html", "report.md"):
        if (folder / name).is_file():
            return folder / name
    return folder / "report.json"


def _link(target: Path, base: Path) -> str:
    import os

    return Path(os.path.relpath(target, base)).as_posix()
