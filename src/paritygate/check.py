"""The check contract: a measurement function plus the facts the verdict needs."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paritygate.result import CheckResult, Measurement, declare_kinds

Thresholds = Mapping[str, float]
"""A check's effective thresholds: its ``defaults`` with the config's overrides applied."""
Measure = Callable[[Any, Thresholds], Measurement]
"""One family's measurement, ``measure(ctx, thresholds)``. Each check types its function on
that family's context (``PolicyContext``, ``LMContext``, ``HFModelContext``); the gate hands
it the context built for the config's family."""


@dataclass
class Rendered:
    """Extra report content a check contributes: files it wrote and fragments to embed."""

    markdown: str = ""
    html: str = ""
    files: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class CheckSpec:
    """One checklist item.

    ``measures`` holds one measurement per family the check applies to: ``measure(ctx,
    thresholds)`` receives that family's context (a loaded policy or language model) and the
    effective thresholds (``defaults`` overridden by the config) and returns a
    :class:`~paritygate.result.Measurement`. It never asserts, prints, reads the golden file
    or asks which family it is measuring.
    """

    id: str
    summary: str
    measures: Mapping[str, Measure]
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

    @property
    def families(self) -> tuple[str, ...]:
        """The families the check applies to, in declaration order."""
        return tuple(self.measures)
