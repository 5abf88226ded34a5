"""When a metric has regressed against its golden value: the margin and the metric's noise.

A clean checkpoint moves a float-error metric from one save to the next: a different set of
weights is a different draw of the same rounding (one max over tokens 9.5e-7 at one step,
1.9e-6 at the next, under a threshold of 1e-5). A regression must exceed that noise, not only a
fraction of the baseline, so every baseline stores, per metric, its **noise floor** (how much a
clean subject moves it) beside the blessed value, with where the number comes from:

- ``blessed value``: a metric where a higher value is worse, blessed at no more than
  :data:`NOISE_ZONE` of its absolute threshold, is rounding noise, not a spent error budget:
  its floor is its own blessed magnitude (a clean checkpoint's sample of the same noise);
- ``declared``: a floor the check measured itself (:attr:`~paritygate.result.Metric.noise`,
  e.g. a reference implementation's error on the same model), when larger;
- none (0): any other metric (an agreement rate, a count, a metric using a quarter or more of
  its budget) is judged by the margin alone.

A metric regresses when it is worse than golden by more than the larger of the margin
(``rel_margin * |golden| + threshold_fraction * threshold``) and :data:`NOISE_FACTOR` times
its floor. ``NOISE_ZONE = 1 / (1 + NOISE_FACTOR)``, so the noise allowance of a blessed-value
floor never reaches past the metric's threshold: within its noise a metric far inside its
threshold never regresses, and a real drift (a layer whose error grew tenfold) still does.
A baseline blessed before floors were stored is judged by the same rule, its floors derived
from its blessed values and today's thresholds (source ``default``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import SupportsFloat, TypedDict

from paritygate.result import CHANGED, REGRESSED, Metric

NOISE_FACTOR = 3.0
"""A change of up to this many noise floors is noise: two clean checkpoints of one run were
seen 2x apart on fp32 rounding metrics (categorical_max_abs 9.5e-7 -> 1.9e-6, max_abs_diff
2.4e-6 -> 4.8e-6); 3x leaves room for a third draw."""
NOISE_ZONE = 1.0 / (1.0 + NOISE_FACTOR)
"""A metric blessed at no more than this fraction of its threshold is at noise level."""


@dataclass(frozen=True)
class Margin:
    """How much worse than golden a metric may get (the config's ``golden`` section)."""

    rel_margin: float = 0.25
    threshold_fraction: float = 0.05


class NoiseEntry(TypedDict):
    """One metric's noise floor as stored in a baseline (``noise.<metric>``)."""

    floor: float
    source: str


@dataclass(frozen=True)
class Noise:
    """How much a clean subject moves one metric, and where that number comes from."""

    floor: float
    source: str

    def to_json(self) -> NoiseEntry:
        return {"floor": self.floor, "source": self.source}


def fmt(value: object) -> str:
    """A metric value as the verdict's messages show it (4 significant digits)."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int) or not isinstance(value, SupportsFloat):
        return str(value)
    v = float(value)
    if v == 0:
        return "0"
    if math.isnan(v) or math.isinf(v):
        return str(v)
    return f"{v:.4g}"


def noise_floor(metric: Metric, blessed: object) -> Noise | None:
    """The noise floor of ``metric`` blessed at ``blessed`` (see the module docstring), or
    ``None`` when it has none (judged by the margin alone)."""
    if not metric.ratchet or metric.bad in ("none", "change"):
        return None
    if isinstance(blessed, bool) or not isinstance(blessed, (int, float)):
        return None
    value = abs(float(blessed))
    found: Noise | None = None
    limit = metric.threshold
    if (metric.bad == "higher" and limit is not None and math.isfinite(limit) and limit > 0
            and math.isfinite(value) and 0 < value <= NOISE_ZONE * limit):
        found = Noise(value, f"blessed value (at most {NOISE_ZONE:g} x threshold {fmt(limit)})")
    return _larger(found, declared_noise(metric))


def declared_noise(metric: Metric) -> Noise | None:
    """The floor the check declares for ``metric`` (:attr:`~paritygate.result.Metric.noise`),
    ``None`` when it declares none."""
    declared = metric.noise
    if declared is None or not math.isfinite(declared) or declared <= 0:
        return None
    return Noise(float(declared), "declared by the check")


def _larger(a: Noise | None, b: Noise | None) -> Noise | None:
    """The larger of two floors (the first on a tie), ``None`` when both are."""
    if a is None or (b is not None and b.floor > a.floor):
        return b
    return a


def blessed_noise(metrics: Mapping[str, Metric]) -> dict[str, NoiseEntry]:
    """The floors a bless stores beside the blessed values (metrics with none are left out)."""
    out: dict[str, NoiseEntry] = {}
    for name, m in metrics.items():
        noise = noise_floor(m, m.value)
        if noise is not None:
            out[name] = noise.to_json()
    return out


def stored_noise(entry: object) -> Noise | None:
    """A baseline's stored floor (``{"floor", "source"}``), ``None`` when absent or malformed."""
    if not isinstance(entry, dict):
        return None
    floor, source = entry.get("floor"), entry.get("source")
    if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not math.isfinite(floor):
        return None
    return Noise(float(floor), str(source or "stored"))


def golden_regression(
    metric: Metric, expected: object, margin: Margin, noise: Noise | None = None
) -> str | None:
    """A reason when ``metric`` regressed against the golden value ``expected``, else ``None``.

    ``noise`` is the metric's noise floor (``None``: the margin alone); the reason states the
    allowance, the floor and its source."""
    if not metric.ratchet or metric.bad == "none" or expected is None or metric.value is None:
        return None
    if metric.bad == "change":
        if metric.value != expected:
            return f"{metric.name} {CHANGED} {fmt(expected)}, obtained {fmt(metric.value)}"
        return None
    if not isinstance(expected, (int, float)):  # bool included, as a number
        return None
    exp, val = float(expected), float(metric.value)
    if not math.isfinite(exp):
        return None
    allowed = margin.rel_margin * abs(exp)
    if metric.threshold is not None:
        allowed += margin.threshold_fraction * abs(metric.threshold)
    noise_allowed = NOISE_FACTOR * noise.floor if noise is not None else 0.0
    how = f"{fmt(max(allowed, noise_allowed))} allowed: margin {fmt(allowed)}"
    if noise is not None:
        how += (f", {NOISE_FACTOR:g} x noise floor {fmt(noise.floor)} = {fmt(noise_allowed)} "
                f"[{noise.source}]")
    else:
        how += ", no noise floor"
    allowed = max(allowed, noise_allowed)
    if metric.bad == "higher" and val > exp + allowed:
        return f"{metric.name} {REGRESSED}: {fmt(val)} > {fmt(exp)} (+{how})"
    if metric.bad == "lower" and val < exp - allowed:
        return f"{metric.name} {REGRESSED}: {fmt(val)} < {fmt(exp)} (-{how})"
    return None


def judged_noise(
    metric: Metric, blessed: object, stored: Mapping[str, object] | None
) -> Noise | None:
    """The floor ``metric`` is judged with: the baseline's stored one (or the floor the check
    declares today, when larger), or for a baseline blessed before floors were stored
    (``stored`` is ``None``) the default derived from its blessed value and today's threshold."""
    if stored is not None:
        # The check's own floor is a property of the measurement, not of the baseline: a
        # floor declared after a baseline was blessed (or larger now) applies to it too.
        return _larger(stored_noise(stored.get(metric.name)), declared_noise(metric))
    derived = noise_floor(metric, blessed)
    if derived is None:
        return None
    return Noise(derived.floor, f"default for a baseline without noise floors: {derived.source}")
