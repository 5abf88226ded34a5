"""One fault, one root cause: which failing check's finding explains the others.

A single fault usually fails several checks: a checkpoint saved with DDP's
``module.`` prefix fails ``weights_load`` and then every check that ran on the
random-init tensors left behind. :func:`explain` walks a declared explanation
graph (:data:`GRAPH`: a failing check, the kinds of its findings that identify the
fault, and the checks that fault makes fail too) over a run's results and

* names the root cause (``RootCause``: the check, the finding kind, its message);
* marks each consequential failure with ``consequence_of`` and rewrites its message
  to ``see <check>: <why>``, followed by its own measurement (the metrics stay), so
  it no longer offers its own guess.

It is a pure function over ``CheckResult`` records (copies are returned) and runs
after the verdict: statuses never change, only how the failures are explained. It
decides from the records' kinds (``(check, finding kind)``) and measured values,
never from message text, so a message can be reworded freely.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from paritygate.causes import Explanation
from paritygate.result import CheckResult, Reason
from paritygate.verdict import BLESS_HINT

FAILED = ("fail", "error")


def collect_graph(check_ids: Iterable[str] | None = None) -> tuple[Explanation, ...]:
    """The declared edges (each module's ``CAUSES``) of ``check_ids`` (default: every check),
    in ``rank`` order, each explaining the checks it names and the downstream checks of its
    ``downstream`` families among ``check_ids``. Only those checks' modules are imported."""
    import importlib

    from paritygate.checks import CHECK_IDS, get_check

    wanted = CHECK_IDS if check_ids is None else [c for c in CHECK_IDS if c in set(check_ids)]
    specs = [get_check(cid) for cid in wanted]
    edges = []
    for cid in wanted:
        for edge in getattr(importlib.import_module(f"paritygate.checks.{cid}"), "CAUSES", ()):
            below = [s.id for s in specs if s.downstream and set(s.families) & set(edge.downstream)
                     and s.id != edge.check and s.id not in edge.explains]
            edges.append(dataclasses.replace(edge, explains=(*edge.explains, *below)))
    return tuple(sorted(edges, key=lambda edge: edge.rank))


if TYPE_CHECKING:
    GRAPH: tuple[Explanation, ...]


def __getattr__(name: str) -> object:
    """``GRAPH``, the whole explanation graph (a failing check, the finding kinds that identify
    a fault, and the checks that fault makes fail too; earlier edges win), read on first use:
    explaining a run needs only its failing checks' edges."""
    if name == "GRAPH":
        graph = collect_graph()
        globals()["GRAPH"] = graph
        return graph
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class RootCause:
    """The failure that explains the run: reported first everywhere."""

    check: str
    kind: str
    message: str
    explains: tuple[str, ...] = ()
    fix: str | None = None
    finding: str | None = None
    """The root check's first finding kind (``missing_reset``, ``squash_missing``), ``None``
    when it failed by a threshold, a regression or a NaN only: what other code acts on when no
    edge of the graph names the fault (``kind`` is then ``independent``)."""

    def to_json(self) -> dict[str, object]:
        return {
            "check": self.check,
            "kind": self.kind,
            "message": self.message,
            "explains": list(self.explains),
            "fix": self.fix,
            "finding": self.finding,
        }


def _findings(result: CheckResult) -> list[Reason]:
    """What the check found wrong: its reasons less a missing baseline (not a finding)."""
    return [r for r in result.reasons if r.kind != "no_golden"]


def _baseline_only(result: CheckResult) -> bool:
    """Failed only by being worse than (or changed from) its baseline: nothing is wrong on this
    run alone. A check with a finding or a threshold breach is the likelier root cause."""
    found = _findings(result)
    return bool(found) and all(r.kind == "regression" for r in found)


def _matches(result: CheckResult, edge: Explanation) -> str | None:
    """``"finding"`` when the root failed by one of the edge's finding kinds (any failed rule
    for ``None``), ``"breach"`` when only by a plain breach of one of its ``breaches``."""
    found = _findings(result)
    if edge.regressed:
        # only a check that failed by its baseline alone: a finding on this run names the
        # fault whether or not a baseline exists (the root's kind never depends on one)
        hit = any(r.kind == "regression" and r.metric in edge.regressed for r in found)
        return "finding" if hit and not result.finding_kinds() else None
    if edge.finding_kinds is None:
        return "finding" if found or not result.reasons else None
    if any(r.kind == "finding" and r.finding in edge.finding_kinds for r in found):
        return "finding"
    plain = not any(r.kind == "finding" for r in found)
    if plain and any(r.kind == "breach" and r.metric in edge.breaches for r in found):
        return "breach"
    return None


def _plain_breach(result: CheckResult) -> bool:
    """Failed by a threshold breach and no finding: nothing names a cause but the numbers."""
    found = _findings(result)
    return any(r.kind == "breach" for r in found) and not any(r.kind == "finding" for r in found)


def _own_measurement(result: CheckResult) -> str:
    """The consequence's own numbers, without its guess at a cause."""
    names = list(result.failed_metrics) or ([result.key_metric] if result.key_metric else [])
    parts = []
    for name in names[:2]:
        value = result.metrics.get(name)
        text = f"{name} {_fmt(value)}"
        if name in result.thresholds:
            text += f" (threshold {_fmt(result.thresholds[name])})"
        parts.append(text)
    return f" Measured here: {', '.join(parts)}." if parts else ""


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def explain(
    results: list[CheckResult], graph: tuple[Explanation, ...] | None = None
) -> tuple[list[CheckResult], RootCause | None]:
    """Results with consequential failures marked and reworded, plus the run's root cause.

    ``None`` when nothing failed. Without a matching edge the first failing check
    is the root cause (kind ``"threshold_breach"`` when it failed by thresholds and named no
    cause, else ``"independent"``), a check that failed only against its
    baseline coming after one with a finding or a threshold breach. Idempotent: results
    already marked keep their messages.
    """
    failing = {r.id: r for r in results if r.status in FAILED}
    if not failing:
        return [dataclasses.replace(r) for r in results], None
    if graph is None:  # only an edge of a failing check can link: the rest need not load
        graph = collect_graph(failing)
    by: dict[str, tuple[str, Explanation]] = {
        r.id: (r.consequence_of, Explanation(r.consequence_of, "", (), (), ""))
        for r in failing.values() if r.consequence_of
    }
    matched: dict[str, Explanation] = {}  # check -> edge of its first matching finding
    roots: set[str] = set()  # checks that explain another: never a consequence themselves
    # A failure with nothing found but a missing baseline neither explains nor is explained.
    linkable = {cid: r for cid, r in failing.items() if not r.reasons or _findings(r)}
    for edge in graph:
        root = linkable.get(edge.check)
        if root is None or root.status != "fail" or root.id in by:
            continue
        how = _matches(root, edge)
        if how is None:
            continue
        linked = False
        for cid in edge.explains:
            if (cid in linkable and cid not in by and cid not in roots and cid != root.id
                    and edge.links(root, linkable[cid])):
                by[cid] = (root.id, edge)
                roots.add(root.id)
                linked = True
        if how == "finding" or linked:
            matched.setdefault(root.id, edge)
    out: list[CheckResult] = []
    for r in results:
        r = dataclasses.replace(r)
        if r.id in by and not r.consequence_of:
            root_id, edge = by[r.id]
            r.consequence_of = root_id
            r.message = f"see {root_id}: {edge.why}.{_own_measurement(r)}"
            r.cause = r.message
            r.fix = failing[root_id].fix
        out.append(r)
    unexplained = [r for r in results if r.id in failing and r.id not in by]
    first = next((r for r in unexplained if r.id in linkable and not _baseline_only(r)), None)
    first = first or next((r for r in unexplained if r.id in linkable), None)
    if first is None:  # only missing baselines, or a cycle in stored results
        first = unexplained[0] if unexplained else next(r for r in results if r.id in failing)
    explained_ids = tuple(cid for cid, (root, _) in by.items() if root == first.id)
    root_edge = matched.get(first.id)
    if root_edge is not None:
        kind, edge_fix = root_edge.kind, root_edge.fix
    elif first.id not in linkable:
        kind, edge_fix = "no_golden", None
    else:
        kind, edge_fix = ("threshold_breach" if _plain_breach(first) else "independent"), None
    finding = next(iter(first.finding_kinds()), None)
    # the root's fix is the fault's; a missing baseline is the fault only when it is all
    fix = first.fix or edge_fix or (first.bless_hint if kind == "no_golden" else None)
    root_cause = RootCause(
        first.id, kind, first.message, tuple(c for c in failing if c in explained_ids),
        fix, finding,
    )
    return out, root_cause


def bless_hint(results: list[CheckResult]) -> str | None:
    """The run's next step when checks lack a golden baseline (``None`` when none does): its
    own line and field, apart from the root cause's fix."""
    missing = [r for r in results if r.bless_hint]
    if not missing:
        return None
    failing = any(r.status in FAILED and _findings(r) for r in results)
    # a command to bless is offered only when nothing else fails: else the generic hint
    command = BLESS_HINT if failing else next(
        (h for h in (r.bless_hint for r in missing) if h and h != BLESS_HINT), BLESS_HINT)
    ids = ", ".join(r.id for r in missing)
    return f"{len(missing)} check(s) have no golden baseline ({ids}): {command}"


def ordered(results: list[CheckResult], root: RootCause | None) -> list[CheckResult]:
    """Report order: the root cause, other independent failures, their consequences,
    then passing and skipped checks (run order within each group)."""
    def rank(r: CheckResult) -> int:
        if root is not None and r.id == root.check:
            return 0
        if r.status in FAILED:
            return 2 if r.consequence_of else 1
        return 3 if r.status == "pass" else 4

    return sorted(results, key=rank)
