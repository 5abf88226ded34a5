"""batchnorm_export: BatchNorm running statistics survive into the artifact."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from paritygate.causes import ROLLOUT, Explanation, artifact_tier_only
from paritygate.check import CheckSpec, Thresholds, cause_limit
from paritygate.checks._artifact_origin import bn_stats_explain_provenance
from paritygate.engines.base import feed_rows, take_rows
from paritygate.metrics import diff_stats, finite_report, magnitude_factor, scaled_note
from paritygate.result import Measurement

if TYPE_CHECKING:
    from torch import nn
    from torch.nn.modules.batchnorm import _BatchNorm

    from paritygate.engines.base import TensorEngine
    from paritygate.families.policy.context import PolicyContext

DEFAULTS = {
    # A row's output must not depend on its batch-mates. fp32 GEMM on different batch
    # sizes can pick different kernels / reduction orders: measured on the demo at
    # ~2e-6 (a couple of ulp at logit magnitude ~10); 2e-5 leaves 10x headroom while a
    # BatchNorm using batch statistics moves logits by O(0.1-1).
    "batch_dependence_max_abs": 2e-5,
    # Artifact vs torch eval on the same probes; same budget as logits_agreement. Above it,
    # the model with reset BatchNorm statistics is compared to name a reset.
    "eval_max_abs_diff": 2e-5,
    # BN initializers vs the checkpoint's running stats, where not folded into a Gemm.
    "stats_max_abs_diff": 1e-6,
}


def _bn_modules(model: nn.Module) -> list[tuple[str, _BatchNorm]]:
    from torch import nn

    return [(n, mod) for n, mod in model.named_modules()
            if isinstance(mod, nn.modules.batchnorm._BatchNorm)]


def _batch_dependence(engine: TensorEngine, out: str, x: Mapping[str, np.ndarray], sizes: list[int],
                      seed: int) -> float:
    """Max |row output in a batch - the same row run alone| over batch sizes 1, 2, N, shuffled."""
    rows = feed_rows(x)
    alone = np.concatenate([engine.infer(take_rows(x, slice(i, i + 1)))[out]
                            for i in range(rows)])
    worst = 0.0
    rng = np.random.default_rng(seed)
    for size in [*sizes, rows]:
        n = (rows // size) * size
        for start in range(0, n, size):
            got = engine.infer(take_rows(x, slice(start, start + size)))[out]
            worst = max(worst, float(np.abs(got - alone[start:start + size]).max()))
    perm = rng.permutation(rows)
    shuffled = engine.infer(take_rows(x, perm))[out]
    worst = max(worst, float(np.abs(shuffled - alone[perm]).max()))
    return worst


def _diff_with_reset_stats(ctx: PolicyContext, candidate: np.ndarray) -> float:
    """Max |artifact - torch eval with every BatchNorm reset to mean 0 / var 1|."""
    import copy

    model = copy.deepcopy(ctx.reference_model)
    for _, mod in _bn_modules(model):
        if mod.track_running_stats and mod.running_mean is not None:
            mod.reset_running_stats()
    model.eval()
    reset = ctx.new_reference_engine(model).infer(ctx.feeds)[ctx.output_name]
    if reset.shape != candidate.shape:
        return float("inf")
    return float(np.abs(reset.astype(np.float64) - candidate).max())


def _checkpoint_stats(m: Measurement, ctx: PolicyContext, bns: list[tuple[str, _BatchNorm]]
                      ) -> None:
    """Fail BatchNorm layers without running statistics in the checkpoint, or with defaults."""
    for name, mod in bns:
        if not mod.track_running_stats or mod.running_mean is None:
            m.fail(
                "no_running_stats",
                f"BatchNorm {name!r} does not track running statistics: it normalises with "
                "batch statistics at inference")
            continue
        keys = [f"{name}.running_mean", f"{name}.running_var"]
        absent = [k for k in keys if k not in ctx.state]
        if absent:
            m.fail(
                "stats_missing",
                f"BatchNorm {name!r} running statistics are not in the checkpoint ({absent}); "
                "non-persistent buffers or dropped before saving")
            continue
        saved_mean, saved_var = ctx.state[keys[0]], ctx.state[keys[1]]
        if bool((saved_mean == 0).all()) and bool((saved_var == 1).all()):
            m.fail(
                "default_stats",
                f"BatchNorm {name!r} has default running statistics (mean 0, var 1): reset "
                "before saving or never updated")


def _artifact_stats(m: Measurement, ctx: PolicyContext, bns: list[tuple[str, _BatchNorm]],
                    thresholds: Thresholds) -> tuple[float, list[str], int]:
    """Fail training-mode BatchNormalization nodes and artifact statistics that match no
    checkpoint layer; return (largest statistics difference, training-mode nodes, number of
    BatchNormalization nodes)."""
    graph = ctx.artifact_graph
    training_nodes = graph.batchnorm_training
    if training_nodes:
        m.fail(
            "training_mode_export",
            f"artifact has BatchNormalization exported in training mode: {training_nodes[:3]}")
    torch_stats = [(n, mod.running_mean.detach().numpy(), mod.running_var.detach().numpy())
                   for n, mod in bns
                   if mod.running_mean is not None and mod.running_var is not None]
    stats_diff = 0.0
    onnx_bns = graph.batchnorm_stats
    for label, mean, var in onnx_bns:
        candidates = [(n, float(max(np.abs(mean - tm).max(), np.abs(var - tv).max())))
                      for n, tm, tv in torch_stats if tm.shape == mean.shape]
        best = min(candidates, key=lambda c: c[1]) if candidates else (None, float("inf"))
        stats_diff = max(stats_diff, best[1])
        if best[1] > cause_limit(thresholds, "stats_max_abs_diff"):
            m.fail(
                "stats_mismatch",
                f"artifact BatchNormalization {label!r} statistics match no BatchNorm running "
                f"statistics in the checkpoint (closest {best[0]!r}, diff {best[1]:.3g}): "
                "stats reset or taken from another model before export")
    if not onnx_bns and bns:
        m.note("BatchNorm folded into neighbouring layers in the artifact; verified numerically")
    return stats_diff, list(training_nodes), len(onnx_bns)


def measure(ctx: PolicyContext, thresholds: Thresholds) -> Measurement:
    m = Measurement("batchnorm_export")
    bns = _bn_modules(ctx.reference_model)
    if not bns:
        m.note("the training model has no BatchNorm layers; batch-independence is still checked")
    _checkpoint_stats(m, ctx, bns)
    stats_diff, training_nodes, onnx_bns = _artifact_stats(m, ctx, bns, thresholds)

    x = take_rows(ctx.feeds, slice(0, min(ctx.n_probes, 16)))
    sizes = list(ctx.spec.batch_sizes)
    try:
        cand_dep: float | None = _batch_dependence(ctx.candidate, ctx.output_name, x, sizes,
                                                   ctx.config.seed)
    except ValueError as exc:  # the engine refuses batch sizes its fixed batch axis cannot run
        cand_dep = None
        m.fail(
            "batch_dependence_unmeasured",
            f"cannot measure the artifact's batch independence: {exc} (see export_integrity)")
    ref_dep = _batch_dependence(ctx.reference, ctx.output_name, x, sizes, ctx.config.seed)
    cand = ctx.candidate_outputs[ctx.output_name]
    bad = finite_report("candidate output", cand)
    if bad:
        m.fail("nonfinite_output", bad)
    if cand.shape != ctx.reference_outputs.shape:
        m.fail(
            "output_shape",
            f"artifact output shape {list(cand.shape)} differs from the training model's "
            f"{list(ctx.reference_outputs.shape)} (see weights_load / export_integrity)")
        eval_diff = None
    else:
        eval_diff = diff_stats(ctx.reference_outputs, cand).max_abs
    # fp32 rounding grows with the outputs' magnitude: the absolute limits grow with it
    limits, tier_note = ctx.artifact_limits(
        thresholds, ["batch_dependence_max_abs", "eval_max_abs_diff"])
    if tier_note:
        m.note(tier_note)
    factor = magnitude_factor(ctx.reference_outputs)
    dep_limit = float(limits["batch_dependence_max_abs"] or 0.0) * factor
    limit = float(limits["eval_max_abs_diff"] or 0.0) * factor
    if factor > 1:
        m.note(scaled_note({"batch_dependence_max_abs": dep_limit, "eval_max_abs_diff": limit},
                           factor))  # fmt: skip
    if cand_dep is not None:
        m.metric("batch_dependence_max_abs", cand_dep, threshold=dep_limit, key=True)
    m.metric("reference_batch_dependence_max_abs", ref_dep, threshold=dep_limit,
             limit_key="batch_dependence_max_abs")
    # Shown, not judged on its own: an artifact that differs from torch eval fails here only
    # when BatchNorm explains it (reset or training-mode statistics, below); any other cause
    # (a stale artifact, a low-precision layer) is logits_agreement's and export_integrity's.
    m.metric("eval_max_abs_diff", eval_diff, bad="none", ratchet=False)
    m.metric("stats_max_abs_diff", stats_diff, threshold=thresholds["stats_max_abs_diff"])
    m.metric("batchnorm_layers", len(bns), bad="none", ratchet=False)
    m.metric("artifact_batchnorm_nodes", onnx_bns, bad="none", ratchet=False)
    if bns and eval_diff is not None and eval_diff > limit and not training_nodes:
        reset_diff = _diff_with_reset_stats(ctx, cand)
        m.metric("reset_stats_max_abs_diff", reset_diff, bad="none", ratchet=False)
        folded = " (BatchNorm is folded into the artifact's Conv/Gemm weights)" if (
            onnx_bns == 0) else ""
        if reset_diff <= limit:
            m.fail(
                "stats_reset",
                f"BatchNorm statistics reset before export{folded}: the artifact matches the "
                f"model with default running statistics (max diff {reset_diff:.3g}), not the "
                f"checkpoint's (max diff {eval_diff:.3g})")
        else:
            m.note(f"artifact differs from torch eval by {eval_diff:.3g} and also from the "
                   f"model with reset BatchNorm statistics ({reset_diff:.3g}): the cause is not "
                   "BatchNorm alone (see logits_agreement and export_integrity)")
    if cand_dep is not None and cand_dep > dep_limit:  # the size alone names no cause
        m.hint("batch_dependence_max_abs",
               "an artifact row's output depends on its batch-mates; possible cause: BatchNorm "
               "on batch statistics (exported in training mode?)")
    return m


CHECK = CheckSpec(
    id="batchnorm_export",
    summary="BatchNorm running statistics survive into the artifact",
    measures={"policy": measure},
    downstream=True,
    defaults=DEFAULTS,
    feeds_probes=True,
    kinds=("no_running_stats", "stats_missing", "default_stats", "training_mode_export",
           "stats_mismatch", "batch_dependence_unmeasured", "output_shape", "stats_reset"),
)

CAUSES: tuple[Explanation, ...] = (
    Explanation("batchnorm_export", "training_mode_export",
                ("training_mode_export",),
                ("dropout_off", "logits_agreement", "head_removal", "export_integrity",
                 "precision_per_layer", "rollout_parity", "batch_invariance"),
                "the artifact was exported in training mode",
                fix="call model.eval() before exporting",
                only_if=(("export_integrity", bn_stats_explain_provenance),
                         ("precision_per_layer", artifact_tier_only), *ROLLOUT),
                rank=200),
    Explanation("batchnorm_export", "stats_reset",
                ("stats_missing", "default_stats", "stats_mismatch", "stats_reset"),
                ("logits_agreement", "export_integrity", "precision_per_layer", "rollout_parity"),
                "the artifact normalises with other BatchNorm statistics than the checkpoint's",
                only_if=(("export_integrity", bn_stats_explain_provenance),
                         ("precision_per_layer", artifact_tier_only), *ROLLOUT),
                rank=210),
)

POSITION = 20
"""The check's place in the checklist (and in every report): the registry sorts by it."""
