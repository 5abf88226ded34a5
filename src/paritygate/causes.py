"""Root-cause edges and what a consequence must have measured for one to link.

Each check module declares the edges it owns (``CAUSES``: its findings and the checks they
make fail too) beside the check; :mod:`paritygate.rootcause` collects them from the registry
in ``rank`` order. This module holds the edge record and the tests edges share.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from paritygate.result import CheckResult

__all__ = [
    "ACTING",
    "ALL_MODELS",
    "LM",
    "REPLAY",
    "ROLLOUT",
    "TARGET_SERVED",
    "TARGET_SERVED_FIX",
    "Explanation",
    "actions_differ",
    "artifact_tier_only",
    "declared_outputs_only",
    "failed_only",
    "no_layer_over_budget",
    "provenance_only",
    "shape_only",
]


@dataclass(frozen=True)
class Explanation:
    """An edge set of the graph: ``check``'s finding of one of ``finding_kinds`` (the root-cause
    ``kind`` it identifies) explains ``explains``."""

    check: str
    kind: str
    finding_kinds: tuple[str, ...] | None
    """Finding kinds of ``check`` that identify the fault; ``None``: any failed rule of the
    check (a finding, breach, regression or non-finite metric) does."""
    explains: tuple[str, ...]
    why: str
    """Why the explained checks fail too (one clause, written into their messages)."""
    fix: str | None = None
    """The likely fix of the root finding, shown with the root cause."""
    only_if: tuple[tuple[str, Callable[[CheckResult, CheckResult], bool]], ...] = ()
    """Explained checks linked only when ``test(root, consequence)`` holds: decided from
    what the consequence measured (checks absent here are linked whenever they fail)."""
    breaches: tuple[str, ...] = ()
    """Metrics of ``check`` whose plain threshold breach (no finding) also identifies the edge,
    but only where it explains a failing consequence: the consequence measured the same thing
    (a lone breach stays ``threshold_breach``)."""

    regressed: tuple[str, ...] = ()
    """Metrics whose golden regression identifies the fault (a digest that changed between
    checkpoints); an edge with these matches on them instead of on findings."""
    rank: int = 0
    """The edge's place in the graph: earlier edges win (a check explained by one edge is
    never the root of a later one). Edges are declared beside the check that owns them."""
    downstream: tuple[str, ...] = ()
    """Families whose downstream checks (``CheckSpec.downstream``: they measure what the models
    compute) the edge explains too, besides ``explains``: a new check that runs the models is
    explained by declaring itself downstream, not by editing this edge.
    :func:`paritygate.rootcause.collect_graph` adds their ids to ``explains``."""

    def links(self, root: CheckResult, consequence: CheckResult) -> bool:
        test = dict(self.only_if).get(consequence.id)
        return test is None or bool(test(root, consequence))


# --- what a consequence measured: does the root's finding account for it? -----------------------


def failed_only(consequence: CheckResult, allowed: Callable[[str], bool]) -> bool:
    """Every breached metric is one the root accounts for, and no own finding is extra."""
    failed = consequence.failed_metrics
    return bool(failed) and all(allowed(name) for name in failed)


def provenance_only(consequence: CheckResult) -> bool:
    """export_integrity failed only because the artifact's outputs differ from torch's."""
    return failed_only(consequence, lambda n: n == "provenance_max_abs_diff")


def shape_only(root: CheckResult, c: CheckResult) -> bool:
    """The consequence failed only because the artifact's output has another shape."""
    kinds = set(c.finding_kinds())
    return bool(kinds) and kinds <= {"output_shape"}


def declared_outputs_only(root: CheckResult, c: CheckResult) -> bool:
    """export_integrity failed only on its declared outputs after the first."""
    return failed_only(c, lambda n: n == "declared_outputs_differ")


def artifact_tier_only(root: CheckResult, c: CheckResult) -> bool:
    """precision_per_layer failed only its ONNX tier: artifact vs torch, the root's gap."""
    return failed_only(c, lambda n: n.startswith("onnx/"))


def no_layer_over_budget(root: CheckResult, c: CheckResult) -> bool:
    """Output error without a layer over its budget: the forward differs run to run."""
    return failed_only(c, lambda n: n.endswith("output_rel_l2"))


ACTING = {"action_divergence": "unexcused_divergences", "nonfinite_action": "nonfinite_actions"}
"""rollout_parity's findings about the actions taken, each with the metric it breaches."""


def actions_differ(root: CheckResult, c: CheckResult) -> bool:
    """rollout_parity failed only by the actions it took (diverging, or NaN/Inf), never by
    returns or trajectories that differ under agreeing actions (the root does not explain
    an environment that is not reproducible)."""
    kinds = c.finding_kinds()
    return bool(kinds) and all(k in ACTING for k in kinds) and failed_only(
        c, lambda n: n in ACTING.values())


TARGET_SERVED = ("the artifact was built from the target network, a training-only copy of "
                  "the policy")
TARGET_SERVED_FIX = ("export the online network (the policy the checkpoint acts with), not its "
                      "target copy")
"""Why and fix of ``target_network_served``, named by export_integrity or, when it did not run,
logits_agreement."""


REEXPORT_FIX = ("re-export from the gated checkpoint in eval mode up to the declared policy "
                "output (same input order, no added softmax or scale; a low-precision "
                "artifact declared as policy.artifact_dtype)")
"""The fix of an artifact whose outputs differ from torch eval."""

ROLLOUT = (("rollout_parity", actions_differ),)
"""The artifact-side and preprocessing roots explain a rollout's actions only."""


def replayed_outputs_differ(root: CheckResult, c: CheckResult) -> bool:
    """serving_replay failed only by what serving computed (its preprocessed inputs or its
    outputs), never by a log the probes do not cover or an empty one."""
    kinds = c.finding_kinds()
    return bool(kinds) and set(kinds) <= {"serving_preprocessing_differs", "served_outputs_differ"}


REPLAY = (("serving_replay", replayed_outputs_differ),)
"""A root on the serving path explains the served records that differ from the replay."""

LM = ("causal_lm",)
"""``Explanation.downstream`` of an edge on the causal-LM models' weights."""
ALL_MODELS = ("policy", "causal_lm")
"""``Explanation.downstream`` of an edge on weights both families load."""

