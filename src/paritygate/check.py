"""The check contract: a measurement function plus the facts the verdict needs."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paritygate.result import CheckResult, Measurement, declare_kinds


@dataclass
class Rendered:
    """Extra report content a check contributes: files it wrote and fragments to embed."""

    markdown: str = ""
    html: str = ""
    files: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class CheckSpec:
    """One checklist item.

    ``measure(ctx, thresholds)`` receives the family context (a loaded policy or
    language model) and the effective thresholds (``defaults`` overridden by the
    config) and returns a :class:`~paritygate.result.Measurement`. It never
    asserts, prints or reads the golden file.
    """

    id: str
    summary: str
    families: tuple[str, ...]
    measure: Callable[[Any, Mapping[str, float]], Measurement]
    defaults: Mapping[str, float] = field(default_factory=dict)
    marks: tuple[str, ...] = ("fast",)
    render: Callable[[CheckResult, Path], Rendered] | None = None
    """Optional: write extra artifacts (CSV, PNG) into the report dir and return fragments."""
    feeds_probes: bool = False
    """The check runs the models on the family's model-input probes: its record says how
    many probe rows the context left out of them (NaN/Inf observations) and why."""
    kinds: tuple[str, ...] = ()
    """The finding kinds the check records (``Measurement.fail(kind, ...)``); registering the
    spec declares them, and recording any other kind raises."""

    def __post_init__(self) -> None:
        declare_kinds(self.id, self.kinds)
