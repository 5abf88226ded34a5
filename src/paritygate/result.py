"""Measurement records: what a check returns, before any verdict is applied.

A check measures; it never decides. It returns a :class:`Measurement` holding
named :class:`Metric` values (each knowing which direction is bad and its
absolute threshold), :class:`Finding` records (named causes that fail the check
whatever the numbers say: a declared ``kind`` that code acts on and a ``message``
that users read), and *details*: the typed records the check declares beside itself
(:mod:`paritygate.records`), serialised under their fields' names.
:mod:`paritygate.verdict` turns a measurement plus the golden baseline into a
:class:`CheckResult`, whose :class:`Reason` records say which rule failed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from paritygate.records import Record

R = TypeVar("R", bound=Record)

Bad = Literal["higher", "lower", "change", "none"]
"""Which direction of a metric is worse.

``higher``: errors, diffs, counts of bad things. ``lower``: agreement rates,
cosine similarity, SQNR. ``change``: any difference from golden is a regression
(shapes, counts that must stay fixed). ``none``: informational, never judged.
"""

Status = Literal["pass", "fail", "skip", "error"]


NO_GOLDEN = "no golden baseline"
"""The message of a missing-baseline reason: bookkeeping, not a finding."""
REGRESSED = "regressed vs golden"
CHANGED = "changed: golden"
"""How the verdict words a failure found only against the baseline (:mod:`paritygate.verdict`)."""

ReasonKind = Literal[
    "finding", "breach", "regression", "nonfinite", "no_golden", "probe_set_changed"
]
"""Which verdict rule a :class:`Reason` records (see :mod:`paritygate.verdict`)."""
REASON_KINDS: tuple[ReasonKind, ...] = (
    "finding", "breach", "regression", "nonfinite", "no_golden", "probe_set_changed"
)

COMMON_KINDS: tuple[str, ...] = ("nonfinite_output",)
"""Finding kinds every check may record: a compared output holds NaN/Inf (the gate records
it for a check whose model raised :class:`~paritygate.errors.NonFiniteOutput`)."""

def _is_kind(name: str) -> bool:
    """snake_case: ASCII lower-case letters, digits and underscores, starting with a letter."""
    return (name[:1].isalpha() and name.isascii() and name == name.lower()
            and name.replace("_", "").isalnum())


_DECLARED: dict[str, frozenset[str]] = {}
"""check id -> its declared finding kinds, filled by :func:`declare_kinds`."""


def declare_kinds(check_id: str, kinds: tuple[str, ...]) -> None:
    """Register ``check_id``'s vocabulary of finding kinds (done by its
    :class:`~paritygate.check.CheckSpec`); a kind must be snake_case and unique."""
    bad = [k for k in kinds if not _is_kind(k)]
    if bad:
        raise ValueError(f"{check_id}: finding kinds must be snake_case: {bad}")
    if len(set(kinds)) != len(kinds):
        raise ValueError(f"{check_id}: finding kinds declared twice: {sorted(kinds)}")
    _DECLARED[check_id] = frozenset(kinds) | frozenset(COMMON_KINDS)


def declared_kinds(check_id: str) -> frozenset[str] | None:
    """The finding kinds ``check_id`` may record, or ``None`` for an unregistered id."""
    return _DECLARED.get(check_id)



@dataclass(frozen=True)
class Finding:
    """A named cause that fails a check: ``kind`` is for code, ``message`` for people."""

    kind: str
    message: str
    metric: str | None = None
    """The metric whose breach this finding explains (the verdict states both in one sentence)."""

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind, "message": self.message, "metric": self.metric}


@dataclass(frozen=True)
class Reason:
    """One failed verdict rule: its ``kind``, the sentence users read, the metric it is about
    and, for a finding, the finding's own kind."""

    kind: ReasonKind
    message: str
    metric: str | None = None
    finding: str | None = None

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind, "message": self.message, "metric": self.metric,
                "finding": self.finding}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Reason:
        return cls(data["kind"], data["message"], data.get("metric"), data.get("finding"))


@dataclass(frozen=True)
class Metric:
    """One named number with the rule that judges it."""

    name: str
    value: float | int | bool | None
    bad: Bad = "higher"
    threshold: float | None = None
    unit: str = ""
    key: bool = False
    ratchet: bool = True
    """Compare with golden (False for metrics that legitimately vary between checkpoints)."""
    detail: bool = False
    """One of many per-item numbers (a layer's error): judged and ratcheted like any metric,
    but kept out of the report's metric tables, report.json ``metrics`` and JUnit; the check's
    own table and files list them, and golden stores them in ``<check_id>.detail.json``."""
    limit_key: str | None = None
    """The threshold key its limit comes from (``thresholds.<check>.<key>``) when that is not
    the metric's own name (``p99_abs_diff`` is bounded by ``max_abs_diff``)."""
    noise: float | None = None
    """How much a clean subject moves this metric, when the check measured it (a reference
    implementation's error on the same model): stored with a blessed baseline as the metric's
    noise floor (:mod:`paritygate.regression`)."""

    def is_finite(self) -> bool:
        """False for NaN/Inf values; ``None`` means not measured and counts as finite."""
        if self.value is None or isinstance(self.value, bool):
            return True
        return math.isfinite(float(self.value))

    def breaches(self, threshold: float | None = None) -> bool:
        """True when the value is on the bad side of the threshold (NaN always breaches)."""
        limit = self.threshold if threshold is None else threshold
        if self.value is None:
            return False
        if not self.is_finite():
            return True
        if limit is None or self.bad in ("none", "change"):
            return False
        value = float(self.value)
        if self.bad == "higher":
            return value > limit
        return value < limit


@dataclass
class Measurement:
    """What a check observed: metrics, named causes of failure and report details."""

    check_id: str
    metrics: dict[str, Metric] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None
    hints: dict[str, str] = field(default_factory=dict)
    """Metric name -> what its breach usually means, for people (:meth:`hint`)."""

    def metric(
        self,
        name: str,
        value: float | int | bool | None,
        *,
        bad: Bad = "higher",
        threshold: float | None = None,
        unit: str = "",
        key: bool = False,
        ratchet: bool = True,
        detail: bool = False,
        limit_key: str | None = None,
        noise: float | None = None,
    ) -> Metric:
        """Record a metric; ``value`` is converted to a plain Python number."""
        if value is not None and not isinstance(value, (bool, int)):
            value = float(value)
        elif isinstance(value, int) and not isinstance(value, bool):
            value = int(value)
        m = Metric(name, value, bad, threshold, unit, key, ratchet, detail, limit_key,
                   None if noise is None else float(noise))
        self.metrics[name] = m
        return m

    def fail(self, kind: str, message: str, *, metric: str | None = None) -> Finding:
        """Record a named cause that fails the check regardless of thresholds.

        ``kind`` must be one the check declares (:attr:`~paritygate.check.CheckSpec.kinds`):
        the root-cause graph and the verdict act on it, never on ``message``. ``metric`` ties
        the cause to the metric whose breach it explains: the verdict then states breach and
        cause in one sentence, and drops the cause when the golden baseline shows the metric
        unchanged (only the threshold was tightened).
        """
        declared = declared_kinds(self.check_id)
        if declared is not None and kind not in declared:
            raise ValueError(f"{self.check_id} records the undeclared finding kind {kind!r} "
                             f"(declared: {', '.join(sorted(declared))})")
        if not _is_kind(kind):
            raise ValueError(f"finding kind {kind!r} is not snake_case")
        finding = Finding(kind, message, metric)
        if finding not in self.findings:
            self.findings.append(finding)
        return finding

    def hint(self, metric: str, text: str) -> None:
        """Say what a breach of ``metric`` usually means (``"artifact logits differ; possible
        causes: stale artifact, ..."``) when the measurement itself names no cause.

        Not a finding: the breach stays a plain threshold breach (root cause kind
        ``threshold_breach``); the verdict adds the text to the breach's sentence, and drops it
        when the golden baseline breaches too (a tightened threshold).
        """
        self.hints[metric] = text

    def record(self, record: R) -> R:
        """Keep ``record`` (a :class:`~paritygate.records.Record` the check declares) in the
        details, under its fields' keys."""
        self.details.update(record.to_json())
        return record

    def note(self, text: str) -> None:
        """Record context for the report that is not a failure."""
        self.notes.append(text)

    def skip(self, reason: str) -> Measurement:
        self.skipped = reason
        return self


@dataclass
class CheckResult:
    """A measurement judged against thresholds and golden."""

    id: str
    status: Status
    message: str
    metrics: dict[str, float | None]
    golden: dict[str, object] | None
    thresholds: dict[str, float]
    key_metric: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0
    reasons: list[Reason] = field(default_factory=list)
    cause: str | None = None
    """The first failure sentence: what differs, by how much (``None`` when passing)."""
    fix: str | None = None
    """The likely fix, when the verdict or the root-cause step knows one."""
    consequence_of: str | None = None
    """Id of the check whose failure explains this one (set by :mod:`paritygate.rootcause`)."""
    failed_metrics: list[str] = field(default_factory=list)
    """Metrics that breached a threshold, regressed against golden or are non-finite."""
    bless_hint: str | None = None
    """How to get the golden baseline the check lacks (``None`` when it has one): kept apart
    from ``fix``, which is the fault's and never depends on whether a baseline exists."""

    def record(self, record: R) -> R:
        """Keep ``record`` in the details, under its fields' keys (as
        :meth:`Measurement.record`)."""
        self.details.update(record.to_json())
        return record

    def finding_kinds(self) -> list[str]:
        """The kinds of the check's findings, in verdict order."""
        return [r.finding for r in self.reasons if r.kind == "finding" and r.finding]

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "status": self.status,
            "message": self.message,
            "cause": self.cause,
            "fix": self.fix,
            "consequence_of": self.consequence_of,
            "failed_metrics": list(self.failed_metrics),
            "bless_hint": self.bless_hint,
            "metrics": self.metrics,
            "golden": self.golden,
            "thresholds": self.thresholds,
            "key_metric": self.key_metric,
            "reasons": [r.to_json() for r in self.reasons],
            "duration_s": round(self.duration_s, 4),
            "details": self.details,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CheckResult:
        return cls(
            id=data["id"],
            status=data["status"],
            message=data["message"],
            metrics=data.get("metrics", {}),
            golden=data.get("golden"),
            thresholds=data.get("thresholds", {}),
            key_metric=data.get("key_metric"),
            details=data.get("details", {}),
            duration_s=data.get("duration_s", 0.0),
            reasons=[Reason.from_json(r) for r in data.get("reasons", [])],
            cause=data.get("cause"),
            fix=data.get("fix"),
            consequence_of=data.get("consequence_of"),
            failed_metrics=data.get("failed_metrics", []),
            bless_hint=data.get("bless_hint"),
        )
