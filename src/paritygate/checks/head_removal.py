"""head_removal: dropping training-only heads leaves the policy output unchanged."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from paritygate.causes import ROLLOUT, Explanation, shape_only
from paritygate.check import CheckSpec, cause_limit
from paritygate.metrics import diff_stats, finite_report, same_tensor
from paritygate.result import Measurement

if TYPE_CHECKING:
    from paritygate.families.policy.context import PolicyContext

DEFAULTS = {
    # Training and inference models run the same fp32 ops on the same weights, so the
    # outputs are normally bitwise equal; 1e-6 allows a different but equivalent op order.
    "policy_max_abs_diff": 1e-6,
}


def _spread(a: np.ndarray, b: np.ndarray) -> float:
    """Max |a - b|; NaN at the same places counts as equal, elsewhere as inf."""
    if a.shape != b.shape or not np.array_equal(np.isnan(a), np.isnan(b)):
        return float("inf")
    seen = ~np.isnan(a)
    return float(np.abs(a[seen].astype(np.float64) - b[seen]).max()) if seen.any() else 0.0


def _left_heads(state: Mapping[str, object], heads: list[str]) -> list[str]:
    """Inference tensors under a declared head, less those that are also a policy-path tensor
    under another name (a shared module registered under the head's name too): identity, not
    names, decides what was left in."""
    from paritygate.checkpoints import find_aliases

    def under(k: str) -> bool:
        return any(k == h or k.startswith(h + ".") for h in heads)

    named = [k for k in state if under(k)]
    shared = find_aliases(dict(state), {k for k in state if not under(k)}, by_value=False)
    return [k for k in named if k not in shared]


def _parameters(m: Measurement, ctx: PolicyContext) -> tuple[list[str], list[str]]:
    """Fail undeclared heads, foreign, differing and left-over head parameters of the
    inference model; return (foreign, differing) parameter names."""
    heads = list(ctx.spec.training_heads)
    # Every name a module is registered under (SB3 registers its shared features extractor
    # three times): a head is matched by any of them.
    train_names = dict(ctx.reference_model.named_modules(remove_duplicate=False))
    infer_state = ctx.heads_removed_model.state_dict()
    train_state = ctx.reference_model.state_dict()
    for head in heads:
        if head not in train_names and head not in train_state and not any(
                k.startswith(head + ".") for k in train_state):
            m.fail(
                "undeclared_head",
                f"declared training head {head!r} is neither a module nor a parameter or "
                "buffer of the training model")
    foreign = [k for k in infer_state if k not in train_state]
    if foreign:
        m.fail(
            "foreign_parameters",
            f"inference model has parameters the training model lacks: {foreign[:5]}")
    differing = [
        k
        for k in infer_state
        if k in train_state
        and (
            infer_state[k].shape != train_state[k].shape
            or not same_tensor(infer_state[k], train_state[k])
        )
    ]
    if differing:
        m.fail(
            "parameters_differ",
            f"inference parameters differ from the training model's: {differing[:5]}")
    leftover = _left_heads(infer_state, heads)
    if leftover:
        m.fail(
            "head_left",
            f"training-only head parameters remain in the inference model: {leftover[:5]}")
    return foreign, differing


def _artifact_outputs(m: Measurement, ctx: PolicyContext) -> int:
    """Fail outputs the artifact exposes beyond (or lacks of) the declared ones; return how
    many it exposes undeclared."""
    declared = list(ctx.spec.output_names)
    exposed = list(ctx.artifact_graph.output_names)
    extra = [o for o in exposed if o not in declared]
    absent = [o for o in declared if o not in exposed]
    if extra:
        m.fail(
            "undeclared_outputs",
            f"artifact exposes undeclared outputs {extra} (a training head left in the export?)")
    if absent:
        m.fail("missing_outputs", f"artifact lacks declared outputs {absent}")
    return len(extra)


def measure(ctx: PolicyContext, thresholds: Mapping[str, float]) -> Measurement:
    m = Measurement("head_removal")
    foreign, differing = _parameters(m, ctx)

    # The inference model is the training model less its heads: it answers in the training
    # output's terms, or in the env action's when its factory applies the action transform.
    reference = ctx.heads_removed_terms(ctx.reference_results[ctx.output_name])
    candidate = ctx.heads_removed_outputs
    for label, arr in (
        ("training policy output", reference),
        ("inference model output", candidate),
    ):
        bad = finite_report(label, arr)
        if bad:
            m.fail("nonfinite_output", bad)
    # A forward that disagrees with itself cannot be compared with another one: name the
    # randomness instead of blaming a removed step (dropout_off measures it).
    again = {
        "inference model": ctx.heads_removed_engine.infer(ctx.feeds)[ctx.output_name],
        "training model": ctx.heads_removed_terms(ctx.reference.infer(ctx.feeds)[ctx.output_name]),
    }
    random_sides = []
    for side, first in (("inference model", candidate), ("training model", reference)):
        spread = _spread(first, again[side])
        if spread > 0:
            random_sides.append(side)
            m.fail(
                "nondeterministic",
                f"{side} is not deterministic: two forwards on the same probes differ by up to "
                f"{spread:.3g} (randomness on the policy path: dropout with training=True or "
                "sampling in forward; see dropout_off), so head removal cannot be compared"
            )
    if candidate.shape != reference.shape:
        m.fail(
            "output_shape",
            f"inference output shape {list(candidate.shape)} differs from the training policy "
            f"output {list(reference.shape)}"
        )
        diff = float("inf")
    else:
        diff = diff_stats(reference, candidate).max_abs
    m.metric("policy_max_abs_diff", diff, threshold=thresholds["policy_max_abs_diff"], key=True)
    if (
        diff > cause_limit(thresholds, "policy_max_abs_diff")
        and not differing
        and not foreign
        and not random_sides
    ):
        m.fail(
            "step_removed",
            "inference forward differs from the training model's policy path with identical "
            "weights: a step (shared norm, activation) was removed with the heads or skipped"
        )

    m.metric("undeclared_outputs", _artifact_outputs(m, ctx), threshold=0)
    m.metric("differing_parameters", len(differing) + len(foreign), threshold=0)
    return m


CHECK = CheckSpec(
    id="head_removal",
    summary="dropping training-only heads leaves the policy output unchanged",
    measures={"policy": measure},
    downstream=True,
    defaults=DEFAULTS,
    feeds_probes=True,
    kinds=("undeclared_head", "foreign_parameters", "parameters_differ", "head_left",
           "nondeterministic", "output_shape", "step_removed", "undeclared_outputs",
           "missing_outputs"),
)

CAUSES: tuple[Explanation, ...] = (
    Explanation("head_removal", "structure_mismatch",
                ("foreign_parameters",),
                ("weights_load",),
                "the inference model's structure differs, so its keys do not match the "
                "checkpoint",
                rank=20),
    Explanation("head_removal", "undeclared_outputs", ("undeclared_outputs",),
                ("export_integrity", "logits_agreement", "batchnorm_export",
                 "precision_per_layer", "rollout_parity"),
                "a training head was exported with the policy",
                fix="export only the inference model's declared outputs",
                only_if=(("batchnorm_export", shape_only), *ROLLOUT), rank=170),
    Explanation("head_removal", "step_removed", ("step_removed",),
                ("batchnorm_export", "logits_agreement", "rollout_parity"),
                "the inference model lacks a step of the training forward", only_if=ROLLOUT,
                rank=190),
)

POSITION = 30
"""The check's place in the checklist (and in every report): the registry sorts by it."""
