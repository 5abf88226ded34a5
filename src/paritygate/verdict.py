"""The one verdict step: a measurement plus thresholds plus golden gives pass or fail.

Rules, in order (every failing rule contributes a reason):
1. a finding (a named cause recorded by the check) fails;
2. a NaN/Inf metric fails, by name;
3. a metric on the bad side of its absolute threshold fails;
4. a ratcheted metric worse than golden by more than the margin fails, where the
   margin is ``rel_margin * |golden| + threshold_fraction * threshold`` (the
   second term keeps near-zero baselines from turning float noise into failures);
   metrics with ``bad="change"`` fail on any difference.
No golden baseline fails too, unless the run is blessing baselines.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from paritygate.result import CheckResult, Measurement, Metric


@dataclass(frozen=True)
class Margin:
    rel_margin: float = 0.25
    threshold_fraction: float = 0.05


def _fmt(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return str(value)
    v = float(value)
    if v == 0:
        return "0"
    if math.isnan(v) or math.isinf(v):
        return str(v)
    return f"{v:.4g}"


def golden_regression(metric: Metric, expected: Any, margin: Margin) -> str | None:
    """A reason when ``metric`` regressed against the golden value ``expected``, else ``None``."""
    if not metric.ratchet or metric.bad == "none" or expected is None or metric.value is None:
        return None
    if metric.bad == "change":
        if metric.value != expected:
            return f"{metric.name} changed: golden {_fmt(expected)}, obtained {_fmt(metric.value)}"
        return None
    try:
        exp = float(expected)
        val = float(metric.value)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(exp):
        return None
    allowed = margin.rel_margin * abs(exp)
    if metric.threshold is not None:
        allowed += margin.threshold_fraction * abs(metric.threshold)
    if metric.bad == "higher" and val > exp + allowed:
        return (
            f"{metric.name} regressed vs golden: {_fmt(val)} > {_fmt(exp)} "
            f"(+{_fmt(allowed)} margin)"
        )
    if metric.bad == "lower" and val < exp - allowed:
        return (
            f"{metric.name} regressed vs golden: {_fmt(val)} < {_fmt(exp)} "
            f"(-{_fmt(allowed)} margin)"
        )
    return None


def judge(
    measurement: Measurement,
    golden: dict[str, Any] | None,
    *,
    margin: Margin = Margin(),
    use_golden: bool = True,
    blessing: bool = False,
) -> CheckResult:
    """Apply the rules above; ``golden`` is the blessed record or ``None``."""
    metrics = {name: m.value for name, m in measurement.metrics.items()}
    thresholds = {
        name: m.threshold for name, m in measurement.metrics.items() if m.threshold is not None
    }
    key = next((m.name for m in measurement.metrics.values() if m.key), None)
    details = dict(measurement.details)
    if measurement.notes:
        details["notes"] = list(measurement.notes)
    expected = (golden or {}).get("metrics") if use_golden else None

    if measurement.skipped is not None:
        return CheckResult(
            measurement.check_id,
            "skip",
            measurement.skipped,
            metrics,
            expected,
            thresholds,
            key,
            details,
        )

    reasons: list[str] = list(measurement.findings)
    offending: list[str] = []  # metrics that fail, first one shown as the key metric
    for m in measurement.metrics.values():
        if not m.is_finite():
            reasons.append(f"{m.name} is {m.value} (non-finite output)")
            offending.append(m.name)
        elif m.breaches():
            op = ">" if m.bad == "higher" else "<"
            reasons.append(f"{m.name}={_fmt(m.value)} {op} threshold {_fmt(m.threshold)}")
            offending.append(m.name)
    if use_golden and not blessing:
        if expected is None:
            reasons.append("no golden baseline")
        else:
            for m in measurement.metrics.values():
                reason = golden_regression(m, expected.get(m.name), margin)
                if reason:
                    reasons.append(reason)
                    offending.append(m.name)

    status = "fail" if reasons else "pass"
    if offending and key not in offending:
        key = offending[0]  # a failing check shows a failing metric, not a passing one
    if reasons:
        message = "; ".join(reasons)
    elif key is not None:
        km = measurement.metrics[key]
        message = f"{key}={_fmt(km.value)}" + (
            f" (threshold {_fmt(km.threshold)})" if km.threshold is not None else ""
        )
    else:
        message = "ok"
    return CheckResult(
        measurement.check_id,
        status,
        message,
        metrics,
        expected,
        thresholds,
        key,
        details,
        reasons=reasons,
    )
