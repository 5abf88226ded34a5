"""The one verdict step: a measurement plus thresholds plus golden gives pass or fail.

Rules, in order (every failing rule contributes a reason):
1. a finding (a named cause recorded by the check) fails;
2. a NaN/Inf metric fails, by name;
3. a metric on the bad side of its absolute threshold fails;
4. a ratcheted metric worse than golden by more than the larger of the margin
   (``rel_margin * |golden| + threshold_fraction * threshold``) and a few times the
   metric's noise floor stored with the baseline (:mod:`paritygate.regression`) fails;
   metrics with ``bad="change"`` fail on any difference.
No golden baseline fails too, unless the run is blessing baselines, and so does a
baseline blessed on another probe set than the run's. Each failing rule is a
:class:`~paritygate.result.Reason` record whose ``kind`` names the rule: later steps
(golden's life cycle, the root-cause graph) act on kinds, never on the wording.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TypedDict

from paritygate.records import Record
from paritygate.regression import Margin as Margin
from paritygate.regression import fmt, judged_noise
from paritygate.regression import golden_regression as golden_regression
from paritygate.result import (
    NO_GOLDEN,
    CheckResult,
    Finding,
    Measurement,
    Metric,
    Reason,
    Status,
)

GoldenValue = float | int | bool | None
"""A blessed metric value (golden files hold numbers, booleans or null)."""


BLESS_HINT = "bless a baseline once every check passes"
"""A check without a baseline says how to get one, apart from its fix (the fault's)."""

DEFAULT_MARGIN = Margin()
"""The config's defaults (``golden.rel_margin`` 0.25, ``golden.threshold_fraction`` 0.05)."""


class GoldenRecord(TypedDict, total=False):
    """A blessed baseline as read from the golden folder (:meth:`GoldenStore.load`)."""

    metrics: dict[str, GoldenValue]
    provenance: dict[str, object]
    detail_metrics: dict[str, GoldenValue]
    """Per-item baselines (a layer's error), from the check's ``.detail.json``."""
    noise: dict[str, object]
    """Per-metric noise floors (:mod:`paritygate.regression`), per-item ones included;
    absent in a baseline blessed before floors were stored."""


@dataclass(frozen=True)
class Notes(Record):
    """What the check and the verdict noted for people (context, not failures)."""

    notes: list[str]


@dataclass(frozen=True)
class NumericsChanged(Record):
    """The settings that move numbers by design and differ from the baseline's."""

    numerics_changed: list[str]


def _noted(result: CheckResult, notes: list[str], changed: list[str] | None = None
           ) -> CheckResult:
    """``result`` with the notes and the changed settings recorded (when there are any)."""
    if notes:
        result.record(Notes(notes))
    if changed:
        result.record(NumericsChanged(changed))
    return result


def judge(
    measurement: Measurement,
    golden: GoldenRecord | None,
    *,
    margin: Margin = DEFAULT_MARGIN,
    use_golden: bool = True,
    blessing: bool = False,
    probes_sha256: str | None = None,
    numerics: Mapping[str, object] | None = None,
) -> CheckResult:
    """Apply the rules above; ``golden`` is the blessed record or ``None``.

    ``probes_sha256`` (the run's probe set) fails a check judged against a baseline blessed
    on other probes; ``numerics`` (the run's settings that move numbers by design) explains
    a regression against a baseline blessed under other ones."""
    shown = {name: m for name, m in measurement.metrics.items() if not m.detail}
    metrics = {name: m.value for name, m in shown.items()}
    thresholds = {name: m.threshold for name, m in shown.items() if m.threshold is not None}
    key = next((m.name for m in shown.values() if m.key), None)
    details = dict(measurement.details)
    notes = list(measurement.notes)
    expected: dict[str, GoldenValue] | None = None
    if use_golden and golden is not None:
        # per-item (detail) baselines live beside the headline ones; both are judged
        expected = {**golden.get("metrics", {}), **golden.get("detail_metrics", {})}

    if measurement.skipped is not None:
        return _noted(CheckResult(measurement.check_id, "skip", measurement.skipped, metrics,
                                  _headline(expected, measurement, golden), thresholds, key,
                                  details), notes)

    reasons, offending, breached = _own_reasons(measurement)
    regressed: dict[str, str] = {}
    no_golden = False
    if use_golden and not blessing:
        if expected is None:
            reasons.append(Reason("no_golden", NO_GOLDEN))
            no_golden = True
        else:
            stored = golden.get("noise") if golden is not None else None
            for m in measurement.metrics.values():
                gold = expected.get(m.name)
                reason = golden_regression(m, gold, margin, judged_noise(m, gold, stored))
                if reason:
                    reasons.append(Reason("regression", reason, m.name))
                    regressed[m.name] = reason
                    if m.name not in offending:
                        offending.append(m.name)
            unguarded = _unguarded(measurement, expected)
            if unguarded:
                notes.append(unguarded)
    probe_change = _probe_set_changed(golden, probes_sha256) if expected is not None else None
    if probe_change is not None:
        reasons.append(Reason("probe_set_changed", probe_change))

    status: Status = "fail" if reasons else "pass"
    if status == "fail":
        key = _failing_key(measurement, [n for n in offending if n in shown], key)
    sentences, fix = _sentences(
        measurement, offending, breached, regressed, expected, no_golden
    )
    if probe_change is not None:
        sentences.append(sentence(probe_change))
    changed = _numerics_changed(golden, numerics) if regressed and expected is not None else []
    if changed:
        fix = ("bless a baseline for this configuration under its own golden.baseline "
               "(a new name, then paritygate run CONFIG --update-golden)")  # fmt: skip
    message = _message(measurement, key, sentences, changed) if reasons \
        else _passing_message(measurement, key)
    result = CheckResult(
        measurement.check_id,
        status,
        message,
        metrics,
        _headline(expected, measurement, golden),
        thresholds,
        key,
        details,
        reasons=reasons,
    )
    _noted(result, notes, changed)
    if no_golden:
        result.bless_hint = BLESS_HINT
    if status == "fail":
        result.cause = sentences[0] if sentences else None
        result.fix = fix
        result.failed_metrics = list(offending)
    return result


def _own_reasons(measurement: Measurement) -> tuple[list[Reason], list[str], set[str]]:
    """What fails on this run alone: the check's findings, non-finite metrics and threshold
    breaches; with the failing metrics (in order) and those that breached."""
    reasons = [Reason("finding", f.message, f.metric, f.kind) for f in measurement.findings]
    offending: list[str] = []  # metrics that fail, first one shown as the key metric
    breached: set[str] = set()
    for m in measurement.metrics.values():
        if not m.is_finite():
            reasons.append(Reason("nonfinite", f"{m.name} is {m.value} (non-finite output)",
                                  m.name))
            offending.append(m.name)
        elif m.breaches():
            op = ">" if m.bad == "higher" else "<"
            reasons.append(Reason(
                "breach", f"{m.name}={fmt(m.value)} {op} threshold {fmt(m.threshold)}", m.name))
            offending.append(m.name)
            breached.add(m.name)
    return reasons, offending, breached


def _message(
    measurement: Measurement, key: str | None, sentences: list[str], changed: list[str]
) -> str:
    """A failing check's message: its sentences, and why its baseline's numbers differ."""
    message = " ".join(sentences)
    if changed:
        message += (f" The golden baseline was blessed with other numerics "
                    f"({', '.join(changed)}); its numbers are not this configuration's.")
    return message


def _passing_message(measurement: Measurement, key: str | None) -> str:
    """A passing check's message: its key metric against its threshold, else ``ok``."""
    if key is None:
        return "ok"
    km = measurement.metrics[key]
    limit = f" (threshold {fmt(km.threshold)})" if km.threshold is not None else ""
    return f"{key}={fmt(km.value)}{limit}"


def _probe_set_changed(golden: GoldenRecord | None, current: str | None) -> str | None:
    """Golden numbers are only comparable on the probes they were blessed with."""
    blessed = (golden or {}).get("provenance", {}).get("probes_sha256")
    if current is None or not isinstance(blessed, str) or not blessed or blessed == current:
        return None
    return (f"probe set changed since the golden baseline was blessed (sha256 "
            f"{blessed[:12]} -> {current[:12]})")


def _numerics_changed(
    golden: GoldenRecord | None, current: Mapping[str, object] | None
) -> list[str]:
    """Settings that move numbers by design (a serving dtype, say) and differ from the
    baseline's: a regression against it is expected of that change."""
    found = (golden or {}).get("provenance", {}).get("numerics")
    blessed: Mapping[str, object] = found if isinstance(found, dict) else {}
    return [f"{k} {blessed[k]} -> {v}" for k, v in (current or {}).items()
            if k in blessed and blessed[k] != v]  # fmt: skip


def _unguarded(measurement: Measurement, expected: Mapping[str, GoldenValue]) -> str | None:
    """A note when the baseline and the run disagree on which ratcheted metrics exist (another
    layer selection or probe set than the one blessed): those metrics are not compared."""
    ratcheted = [
        name for name, m in measurement.metrics.items() if m.ratchet and m.bad != "none"
    ]
    new = [name for name in ratcheted if expected.get(name) is None]
    gone = [name for name in expected if name not in measurement.metrics]
    if not new and not gone:
        return None
    parts = []
    if new:
        parts.append(f"{len(new)} metric(s) have no golden value and are not compared "
                     f"(e.g. {new[0]})")  # fmt: skip
    if gone:
        parts.append(f"{len(gone)} golden value(s) were not measured (e.g. {gone[0]})")
    return "; ".join(parts) + ": bless again if the change is intended (--update-golden)"


def _headline(
    expected: Mapping[str, GoldenValue] | None,
    measurement: Measurement,
    golden: GoldenRecord | None,
) -> dict[str, object] | None:
    """The golden values shown beside the report's metrics: per-item (detail) ones left out
    (a baseline blessed before a metric became a detail one still holds it among ``metrics``)."""
    if expected is None:
        return None
    return {k: v for k, v in expected.items()
            if not (k in measurement.metrics and measurement.metrics[k].detail)
            and k not in (golden or {}).get("detail_metrics", {})}


def sentence(text: str) -> str:
    """``text`` ending with sentence punctuation (messages are runs of sentences)."""
    text = text.strip()
    return text if text.endswith((".", "?", "!")) else text + "."


def _failing_key(measurement: Measurement, offending: list[str], key: str | None) -> str | None:
    """The metric a failing check shows: one that failed, never a passing one.

    Order: a metric that breached or regressed; a metric a finding is tied to; a
    count of bad things that is non-zero (e.g. ``nonfinite_tensors`` of a NaN
    checkpoint rather than its ``missing_keys 0``); else the declared key.
    """
    if offending:
        return key if key in offending else offending[0]
    for name in (f.metric for f in measurement.findings):
        if name is not None and name in measurement.metrics:
            return name
    metrics = measurement.metrics
    if key is not None and _is_bad_count(metrics[key]):
        return key
    for m in metrics.values():  # NaN/Inf counts first: the strongest cause
        if "nonfinite" in m.name and _is_bad_count(m):
            return m.name
    for m in metrics.values():
        if _is_bad_count(m):
            return m.name
    return key


def _golden_breaches(m: Metric, gold: object) -> bool:
    """The blessed value breaches today's threshold too: the model did not change, the
    threshold did (a golden inside the threshold means the model moved within the margin)."""
    if isinstance(gold, bool) or not isinstance(gold, (int, float)):
        return False
    return replace(m, value=gold).breaches()


def _is_bad_count(m: Metric) -> bool:
    return (
        m.bad in ("higher", "change")
        and m.threshold is None
        and isinstance(m.value, (int, float))
        and not isinstance(m.value, bool)
        and m.value > 0
    )


def _sentences(
    measurement: Measurement,
    offending: list[str],
    breached: set[str],
    regressed: dict[str, str],
    expected: Mapping[str, GoldenValue] | None,
    no_golden: bool,
) -> tuple[list[str], str | None]:
    """One sentence per failure (named causes first, then failing metrics) and a likely fix.

    A threshold breach and a golden regression of the same metric become one
    sentence; a finding tied to a metric carries that metric's numbers. When the
    golden value breaches the threshold as well (the model did not change, the
    threshold was tightened), the check's generic explanation is dropped.
    """
    tied: dict[str, list[Finding]] = {}
    out: list[str] = []
    fix: str | None = None
    tightened: list[Metric] = []
    for finding in measurement.findings:
        name = finding.metric
        if name is not None and name in measurement.metrics:
            tied.setdefault(name, []).append(finding)
        else:
            out.append(sentence(finding.message))
    n_findings = len(out)
    nonfinite: list[str] = []
    plain: list[tuple[str, str, str, str]] = []  # (name, value, threshold, side): bare breaches
    for name in offending:
        m = measurement.metrics[name]
        gold = (expected or {}).get(name)
        value = fmt(m.value)
        if not m.is_finite():
            nonfinite.append(f"{name} is {value}")
            continue
        if name in breached and name not in regressed and _golden_breaches(m, gold):
            side = "above" if m.bad == "higher" else "below"
            out.append(sentence(
                f"{name} {value} is {side} the threshold {fmt(m.threshold)}, as is the blessed "
                f"golden {fmt(gold)}: the threshold was tightened below what this model has "
                "always measured"
            ))
            tightened.append(m)
            tied.pop(name, None)  # the check's generic explanation does not apply
            continue
        numbers = []
        if name in breached:
            numbers.append(f"threshold {fmt(m.threshold)}")
        if gold is not None:
            numbers.append(f"golden {fmt(gold)}")
        if name in tied:
            for finding in tied.pop(name):
                text = f"{finding.message} ({name} {value}, {', '.join(numbers)})"
                out.insert(n_findings, sentence(text))
                n_findings += 1
            continue
        side = "above" if m.bad == "higher" else "below"
        hint = measurement.hints.get(name)
        possible = f": {hint}" if hint else ""
        if name in breached and name not in regressed and not hint:
            plain.append((name, value, fmt(m.threshold), side))
        elif name in breached and name not in regressed:
            out.append(sentence(f"{name} {value} is {side} the threshold {fmt(m.threshold)}"
                                f"{possible}"))
        elif name in breached:
            out.append(sentence(f"{name} {value} is {side} the threshold {fmt(m.threshold)} "
                                f"and regressed from the golden {fmt(gold)}{possible}"))
        else:
            out.append(sentence(regressed[name]))
    if nonfinite:
        out.insert(n_findings, sentence(f"non-finite output (NaN/Inf): {', '.join(nonfinite)}"))
    if plain and n_findings:  # the numbers behind the named cause, in its sentence
        first = out[0][:-1] if out[0].endswith(".") else out[0]
        breaches = "; ".join(f"{n} {v}, threshold {t}" for n, v, t, _ in plain)
        out[0] = f"{first} ({breaches})."
    else:
        out += [sentence(f"{n} {v} is {side} the threshold {t}") for n, v, t, side in plain]
    for findings in tied.values():  # tied to a metric that did not fail: keep the cause
        out += [sentence(f.message) for f in findings]
    if tightened:
        fix = _loosen(measurement.check_id, tightened)
    if no_golden:  # bookkeeping, not the fault: the bless hint is its own field
        out.append("no golden baseline.")
    return out, fix


def threshold_keys(check_id: str) -> frozenset[str]:
    """The threshold keys a config may set for ``check_id`` (``thresholds.<check>.<key>``): its
    declared defaults, the one list the config validation, README's tables and a likely fix
    share. Empty for an id that is not a registered check."""
    from paritygate.checks import CHECK_IDS, get_check

    return frozenset(get_check(check_id).defaults) if check_id in CHECK_IDS else frozenset()


def _loosen(check_id: str, tightened: list[Metric]) -> str:
    """The likely fix of thresholds tightened below what the model has always measured: the
    config keys behind them, named only when the check declares them (README lists every
    declared key), once each."""
    declared = threshold_keys(check_id)
    keys = dict.fromkeys(m.limit_key or m.name for m in tightened)
    parts = [f"thresholds.{check_id}.{k}" if k in declared
             else f"the limit of {k} (the check's notes say where it comes from)" for k in keys]
    return f"loosen {' and '.join(parts)} or fix the model, then re-bless"
