"""Report artifacts: report.json (the contract), report.md, report.html and junit.xml.

Every file is written atomically. ``report.md`` is also appended to
``$GITHUB_STEP_SUMMARY`` when that variable is set (GitHub Actions step summary).
The root-cause step (:mod:`paritygate.rootcause`) runs first, so every artifact
leads with the failure that explains the others.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from paritygate.files import atomic_write_many, dump_json
from paritygate.fragments import Rendered
from paritygate.report.json_report import (
    NOTHING_VERIFIED,
    nothing_verified_reason,
    overall_status,
    report_json,
)
from paritygate.report.junit import junit_xml
from paritygate.report.model import SCHEMA_VERSION, validate_report
from paritygate.report.render import report_html, report_markdown
from paritygate.report.table import ICON, key_row, summary_table
from paritygate.result import CheckResult

__all__ = [
    "ICON",
    "NOTHING_VERIFIED",
    "SCHEMA_VERSION",
    "WrittenReport",
    "junit_xml",
    "key_row",
    "nothing_verified_reason",
    "overall_status",
    "report_html",
    "report_json",
    "report_markdown",
    "summary_table",
    "validate_report",
    "write_reports",
]

VALIDATE_ENV = "PARITYGATE_VALIDATE_REPORTS"
"""Set to 1 to validate every report.json against the published schema as it is written."""


@dataclass
class WrittenReport:
    directory: Path
    status: str
    results: list[CheckResult]
    files: list[str] = field(default_factory=list)
    root_cause: str | None = None


class Renderer(Protocol):
    """A check's report fragment: ``render(result, report_dir, figures=...)`` writes its extra
    files into ``report_dir`` and returns what to embed; ``figures`` is true only when a
    report format that shows them (report.html) was asked, so figures cost nothing otherwise."""

    def __call__(self, result: CheckResult, report_dir: Path, *, figures: bool = True
                 ) -> Rendered: ...


class _Renderers(Mapping[str, Renderer]):
    """Renderers by check id, each imported on first use: a renderer reads its check's record
    types, so importing them all would import every family's checks."""

    def __init__(self, paths: dict[str, str]) -> None:
        self._paths = paths

    def __getitem__(self, check_id: str) -> Renderer:
        module, name = self._paths[check_id].split(":")
        render: Renderer = getattr(importlib.import_module(module), name)
        return render

    def __iter__(self) -> Iterator[str]:
        return iter(self._paths)

    def __len__(self) -> int:
        return len(self._paths)


RENDERERS: Mapping[str, Renderer] = _Renderers({
    "rollout_parity": "paritygate.report.rollout:render_rollout",
    "precision_per_layer": "paritygate.precision.render:render_precision",
    "reference_parity": "paritygate.report.reference:render_reference",
    "reward_parity": "paritygate.report.reward:render_reward",
    "behaviour_parity": "paritygate.report.behaviour:render_behaviour",
})
"""The one registry of report renderers, by check id: each draws a check's tables and figures
from its records (``details``) and returns the fragments embedded in report.md and
report.html. Checks measure; they build no table or figure."""


def write_reports(
    gate: Any,
    results: list[CheckResult],
    directory: Path,
    *,
    not_run: list[str] | None = None,
    formats: frozenset[str] | None = None,
) -> WrittenReport:
    """Write the report artifacts into ``directory`` and return what was written.

    ``formats`` (default: the gate config's, see ``report_formats``) names the files besides
    report.json; figures are drawn only when report.html is among them. Each file is rendered
    first, then staged and renamed into place, report.json last: a reader (or a run
    interrupted while writing) never finds a report.json newer than its siblings, and a write
    that fails changes none of them.
    """
    chosen = formats if formats is not None else _config_formats(gate)
    directory.mkdir(parents=True, exist_ok=True)
    extras: dict[str, Rendered] = {}
    files: list[str] = []
    for r in results:
        render = RENDERERS.get(r.id)
        if render is not None and r.status in ("pass", "fail"):
            extras[r.id] = render(r, directory, figures="html" in chosen)
            files += extras[r.id].files
    data = report_json(gate, results, not_run=not_run)
    if os.environ.get(VALIDATE_ENV) == "1":
        validate_report(data)
    md = report_markdown(data, extras) if "md" in chosen or _summary_path() else ""
    texts = {
        "report.md": md if "md" in chosen else None,
        "report.html": report_html(data, extras) if "html" in chosen else None,
        "junit.xml": junit_xml(data) if "junit" in chosen else None,
        "report.json": dump_json(data),
    }
    # staged together and renamed in this order: a failed write (a full disk) leaves the
    # previous report whole
    atomic_write_many({directory / name: text.encode("utf-8")
                       for name, text in texts.items() if text is not None})
    files += [name for name in ("report.json", "report.md", "report.html", "junit.xml")
              if texts[name] is not None]
    for name, text in texts.items():  # an earlier run's page would contradict this report
        if text is None:
            (directory / name).unlink(missing_ok=True)
    summary = _summary_path()
    if summary:
        with open(summary, "a", encoding="utf-8") as fh:
            fh.write(md)
    root = (data.get("root_cause") or {}).get("check")
    return WrittenReport(directory, data["status"], results, files, root)


def _config_formats(gate: Any) -> frozenset[str]:
    config = getattr(gate, "config", None)
    if config is None or not hasattr(config, "formats"):
        from paritygate.config import DEFAULT_REPORT_FORMATS

        return frozenset(DEFAULT_REPORT_FORMATS)
    chosen: frozenset[str] = config.formats()
    return chosen


def _summary_path() -> str | None:
    """``$GITHUB_STEP_SUMMARY``: report.md is appended there whatever the formats."""
    return os.environ.get("GITHUB_STEP_SUMMARY") or None
