"""logits_agreement: the inference path's outputs match the training path's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, cast

import numpy as np

from paritygate import causes
from paritygate.check import CheckSpec, Thresholds
from paritygate.checks._artifact_origin import same_output_gap
from paritygate.checks._continuous_policy import TRANSFORM_KINDS, measure_action, measure_gaussian
from paritygate.metrics import (
    LogitsComparison,
    diff_stats,
    distribution_stats,
    finite_report,
    magnitude_factor,
    scaled_note,
)
from paritygate.metrics.tiers import tier_thresholds
from paritygate.records import OMIT_NONE, Record
from paritygate.result import Measurement

if TYPE_CHECKING:
    from paritygate.engines.hf_generate import HFGenerateEngine
    from paritygate.families.causal_lm.context import LMContext
    from paritygate.families.policy.context import PolicyContext

DEFAULTS = {
    # fp32 torch vs ONNX Runtime on the demo differ by ~2e-6 at logit magnitude ~10
    # (a few ulp, different GEMM kernels). A stale artifact exported from a checkpoint
    # whose weights differ by 1e-4 relative moves logits by ~8e-4 on the demo.
    # 2e-5 sits 10x above the noise and 40x below that fault. For a policy the limit grows
    # with the outputs above magnitude 10 (metrics.magnitude_factor): an ulp grows with them.
    "max_abs_diff": 2e-5,
    # KL(reference || candidate) per probe; fp32 noise gives < 1e-10. A temperature
    # baked into the artifact (T=0.9) gives ~1e-3; 1e-6 separates them by 1000x.
    "kl_max": 1e-6,
    # Total variation per probe; fp32 noise ~1e-7.
    "tv_max": 1e-3,
    # Fraction of probes whose greedy action differs; fp32 noise flips none outside near-ties.
    "argmax_disagreement": 0.0,
    # Worst probe's share of the reference top-k actions present in the candidate top-k.
    "topk_overlap_min": 1.0,
    # Continuous policies with a policy.distribution (Gaussian) only:
    # KL(reference || candidate) of the two Gaussians per probe, summed over action dims. fp32
    # noise on the mean (~2e-6) at std 0.1 gives ~2e-10; a mean 1e-3 off (a stale artifact)
    # gives 5e-5: 1e-6 sits 5000x above the one and 50x below the other. It grows as 1/std^2:
    # a policy whose std is clamped near exp(-20) needs a larger limit (or null).
    "gaussian_kl_max": 1e-6,
    # Max |std_reference - std_candidate|: the same fp32 budget as max_abs_diff (std <= e^2).
    "std_max_abs_diff": 2e-5,
    # Max |action| difference of the deterministic env actions: the fp32 budget of the mean,
    # times max |action_scale| (tanh and clip never widen a difference).
    "action_max_abs_diff": 2e-5,
    # Max |learner recompute - actor's logged log-prob| of sampled actions (tanh correction
    # included). fp32 noise moves it by ~3 * 2e-6 / std (6e-5 at std 0.1); a missing
    # correction or another std moves it by O(0.1-1): 1e-3 sits between.
    "logprob_delta_max_abs": 1e-3,
}


@dataclass(frozen=True)
class WorstProbe(Record):
    """One of the five probe rows whose outputs differ most."""

    probe: int
    max_abs_diff: float
    kl: float | None
    reference_argmax: int
    candidate_argmax: int
    position: str | None = field(default=None, metadata=OMIT_NONE)
    """``<probe id>@<position>`` of the token a causal LM's row scores."""


@dataclass(frozen=True)
class WorstProbes(Record):
    worst_probes: list[WorstProbe]


@dataclass(frozen=True)
class Normaliser(Record):
    """The observation normaliser the artifact was exported without."""

    module: str
    statistics: list[str]


@dataclass(frozen=True)
class NormaliserRecord(Record):
    normaliser_missing: Normaliser


@dataclass(frozen=True)
class ReferenceName(Record):
    """What computed the reference outputs."""

    reference: str


@dataclass(frozen=True)
class CandidateName(Record):
    """What computed the candidate outputs."""

    candidate: str


def compare_logits(m: Measurement, reference: np.ndarray, candidate: np.ndarray,
                   thresholds: Mapping[str, float | None], *, top_k: int = 5,
                   continuous: bool = False) -> LogitsComparison | None:
    """Fill ``m`` with diff and distribution metrics of two (N, A) arrays; return the stats."""
    for label, arr in (("reference output", reference), ("candidate output", candidate)):
        bad = finite_report(label, arr)
        if bad:
            m.fail("nonfinite_output", bad)
    if reference.shape != candidate.shape:
        m.fail("output_shape", f"output shapes differ: reference {list(reference.shape)} vs "
               f"candidate {list(candidate.shape)}")
        return None
    diff = diff_stats(reference, candidate)
    m.metric("max_abs_diff", diff.max_abs, threshold=thresholds["max_abs_diff"], key=True)
    m.metric("mean_abs_diff", diff.mean_abs, bad="none", ratchet=False)
    # A percentile of the same differences: never above max_abs_diff, so its limit bounds it too
    # and gives its golden comparison a noise floor (threshold_fraction of it).
    m.metric("p99_abs_diff", diff.p99_abs, threshold=thresholds["max_abs_diff"],
             limit_key="max_abs_diff")
    m.metric("max_rel_diff", diff.max_rel, bad="none", ratchet=False)
    if continuous:
        return LogitsComparison(diff)
    dist = distribution_stats(reference, candidate, top_k=top_k)
    m.metric("kl_max", dist.kl_max, threshold=thresholds["kl_max"])
    m.metric("kl_mean", dist.kl_mean, bad="none", ratchet=False)
    m.metric("tv_max", dist.tv_max, threshold=thresholds["tv_max"])
    m.metric("argmax_disagreement", 1.0 - dist.argmax_agreement,
             threshold=thresholds.get("argmax_disagreement"))
    m.metric("topk_overlap_min", dist.topk_overlap, bad="lower",
             threshold=thresholds.get("topk_overlap_min"))
    kl_rows = dist.kl_per_row
    rows = np.abs(np.asarray(reference, np.float64) - candidate).reshape(len(reference), -1).max(1)
    order = np.argsort(-rows, kind="stable")[:5]
    m.record(WorstProbes([
        WorstProbe(int(i), float(rows[i]), float(kl_rows[i]) if kl_rows else None,
                   int(np.argmax(reference[i])), int(np.argmax(candidate[i])))
        for i in order
    ]))
    return LogitsComparison(diff, dist)


def _normalised_hint(reference: np.ndarray, candidate: np.ndarray) -> str:
    """Name a softmax / log-softmax applied on one side only (rows normalised)."""

    def probs(x: np.ndarray) -> bool:
        return bool(x.size and np.all(x >= 0) and np.all(x <= 1)
                    and np.allclose(x.reshape(len(x), -1).sum(1), 1, atol=1e-4))

    def logprobs(x: np.ndarray) -> bool:
        return bool(x.size and np.all(x <= 0)
                    and np.allclose(np.exp(x).reshape(len(x), -1).sum(1), 1, atol=1e-4))

    if probs(candidate) and not probs(reference):
        return (" (the artifact's rows are probabilities summing to 1: softmax applied in the "
                "serving forward?)")
    if logprobs(candidate) and not logprobs(reference):
        return (" (the artifact's rows are log-probabilities: log_softmax applied in the "
                "serving forward?)")
    return ""


def measure_policy(ctx: PolicyContext, thresholds: Thresholds) -> Measurement:
    m = Measurement("logits_agreement")
    reference = ctx.reference_outputs
    candidate = ctx.candidate_outputs.get(ctx.output_name)
    if candidate is None:
        m.fail("missing_output", f"artifact has no output {ctx.output_name!r}")
        return m
    continuous = ctx.spec.action_space == "continuous"
    dist = ctx.spec.distribution if continuous else None
    limits, tier_note = ctx.artifact_limits(thresholds, ["max_abs_diff"],
                                            gaussian=dist is not None)
    if tier_note:
        m.note(tier_note)
    factor = magnitude_factor(reference)
    limit = float(limits["max_abs_diff"] or 0.0) * factor
    judged = {**limits, "max_abs_diff": limit}
    if factor > 1:
        m.note(scaled_note({"max_abs_diff": limit}, factor))
    stats = compare_logits(m, reference, candidate, judged, continuous=continuous)
    transform = None
    if dist is not None and stats is not None:
        transform = (measure_gaussian(m, ctx, dist, candidate, limits) if dist.gaussian
                     else measure_action(m, ctx, dist, ctx.reference_results[ctx.output_name],
                                         candidate, limits))
    if stats is not None and stats.diff.max_abs > limit and transform is None:
        ratio = np.asarray(candidate, np.float64) / np.where(reference == 0, np.nan, reference)
        scale = float(np.nanmedian(ratio)) if np.isfinite(ratio).any() else float("nan")
        hint = ""
        if np.isfinite(scale) and abs(scale - 1) > 1e-3 and np.nanstd(ratio) < 1e-3 * abs(scale):
            hint = (f" (candidate = reference x {scale:.4g}: "
                    + ("an action scale applied on one side only? declare the action transform "
                       "in policy.distribution)" if continuous
                       else "a temperature baked into the artifact?)"))
        elif ctx.spec.action_space == "discrete":
            hint = _normalised_hint(np.asarray(reference, np.float64),
                                    np.asarray(candidate, np.float64))
        matches = ctx.initializer_match
        foreign = bool(matches.comparable) and matches.matched + matches.folded == 0
        precision = ctx.artifact_precision
        targets = matches.target_network
        if targets:
            nets = list(matches.target_networks)
            m.fail("target_network_served",
                   f"artifact outputs differ from the training model's by up to "
                   f"{stats.diff.max_abs:.3g}: the artifact was built from the target network "
                   f"{', '.join(nets)} ({len(targets)} of its weight initializers are that "
                   f"network's tensors, e.g. {next(iter(targets.values()))!r}), not the policy",
                   metric="max_abs_diff")
        elif precision.undeclared and precision.stored != "float32":
            m.fail("undeclared_precision",
                   f"artifact logits differ from the training model's by up to "
                   f"{stats.diff.max_abs:.3g}: the artifact stores {precision.stored} weights "
                   f"that policy.artifact_dtype ({precision.declared}) does not declare, so "
                   "they are judged by the float32 limit", metric="max_abs_diff")
        elif (skipped := ctx.normaliser_skipped(np.asarray(candidate, np.float64),
                                                max(limit, 1e-6))) is not None:
            m.fail("normaliser_missing",
                   f"artifact outputs differ from the training model's by up to "
                   f"{stats.diff.max_abs:.3g}, and equal the training model with its "
                   f"observation normaliser {skipped.module!r} skipped (within "
                   f"{skipped.max_abs_diff:.2g}; its statistics {', '.join(skipped.statistics)} "
                   "go unused): the artifact was exported without the normaliser, so it "
                   "computes the network on raw observations", metric="max_abs_diff")
            m.record(NormaliserRecord(Normaliser(skipped.module, skipped.statistics)))
        elif foreign and not hint:
            m.fail("stale_artifact", f"artifact logits differ from the training model's by up to "
                   f"{stats.diff.max_abs:.3g}: stale artifact, not built from this checkpoint "
                   f"(0/{matches.comparable} of its weight initializers match the "
                   "checkpoint's tensors)", metric="max_abs_diff")
        elif hint:  # the outputs themselves show how they differ
            m.fail(
                "artifact_outputs_differ",
                f"artifact logits differ from the training model's by up to "
                f"{stats.diff.max_abs:.3g}{hint}", metric="max_abs_diff")
        else:  # only the size of the gap: a plain breach, the usual causes for people
            m.hint("max_abs_diff", "artifact logits differ from the training model's; possible "
                   "causes: stale artifact, low-precision layer or changed output scaling")
    m.record(ReferenceName(ctx.reference.name))
    m.record(CandidateName(f"{ctx.candidate.name} {ctx.artifact_path.name}"))
    return m


def measure_causal_lm(ctx: LMContext, thresholds: Thresholds) -> Measurement:
    m = Measurement("logits_agreement")
    if "hf" not in ctx.spec.engines:
        if "vllm" not in ctx.spec.engines:
            return m.skip("logits_agreement needs the served model's logits: the HF engine "
                          "or vLLM's prompt log-probs (engines has neither)")
        found = ctx.generations.vllm_served_rows()
        if isinstance(found, str):
            return m.skip(found)
        m.record(CandidateName(f"vLLM prompt log-probs ({ctx.spec.engine.dtype}, teacher-"
                               "forced on its greedy continuations, in the trainer's gauge)"))
        return _judge(ctx, m, thresholds, *found)
    generation = ctx.generations.greedy("hf")
    assert generation is not None  # only a rollout dump may lack a greedy record
    kept = [i for i, output in enumerate(generation.output_ids) if output]
    teacher = ctx.generations.teacher_forced(generation)  # shared with generation_parity
    engine = cast("HFGenerateEngine", ctx.engines["hf"])
    if generation.logits is not None and engine.padding_side == "left":
        # The engine's own KV-cache logits from its greedy generation: left-padded rows decode
        # at the positions of an unpadded decode, so they are the cached decode of these tokens.
        cached = [generation.logits[i] for i in kept]
    else:  # right-padded rows continue from pads: decode the same tokens left-padded
        cached = engine.cached_logits(
            [generation.prompt_ids[i] for i in kept], [generation.output_ids[i] for i in kept]
        )
    refs, cands, owners = [], [], []
    for i, cand in zip(kept, cached, strict=True):
        output = generation.output_ids[i]
        refs.append(teacher[i][: len(output)])
        cands.append(cand)
        owners += [f"{ctx.probes[i].id}@{j}" for j in range(len(output))]
    if not refs:
        return m.skip("the engine generated no tokens for any probe")
    m.record(CandidateName(f"HF engine model ({ctx.spec.engine.dtype}, KV cache)"))
    return _judge(ctx, m, thresholds, np.concatenate(refs), np.concatenate(cands), owners)


def _judge(ctx: LMContext, m: Measurement, thresholds: Thresholds, reference: np.ndarray,
           candidate: np.ndarray, owners: list[str]) -> Measurement:
    """The trainer's ``(N, V)`` logits against the served ones, by the precision tier."""
    limits = _tier_thresholds(ctx, m, thresholds)
    stats = compare_logits(m, reference, candidate, limits)
    if stats is not None:  # the size of the gap names no cause: the usual ones, for people
        m.hint("max_abs_diff",
               f"cached engine logits differ from the trainer's forward (engine "
               f"{ctx.serving.model_dir.name} in {ctx.spec.engine.dtype}, trainer in "
               f"{ctx.spec.training.dtype}); possible causes: stale checkpoint, lower precision "
               "or a cache bug")
    worst = WorstProbes.read(m.details)
    if worst is not None:  # each probe row named by the sequence and position it scores
        m.record(WorstProbes([replace(p, position=owners[p.probe]) for p in worst.worst_probes]))
    m.metric("rows", len(reference), bad="none", ratchet=False)
    m.record(ReferenceName(f"training model ({ctx.spec.training.dtype}, teacher-forced, "
                           "no cache)"))
    return m


def _tier_thresholds(
    ctx: LMContext, m: Measurement, thresholds: Thresholds
) -> dict[str, float | None]:
    """An engine in a lower precision than the trainer is judged by its precision tier
    (:func:`paritygate.metrics.tiers.tier_thresholds`, the rule the policy artifact's limits
    use too, with the LM context's
    :meth:`~paritygate.families.causal_lm.context.LMContext.served_limits`); values the config
    sets win."""
    limits, note = tier_thresholds(ctx.served_limits, thresholds, set(thresholds.overrides))
    if note:
        m.note(f"{note}; argmax and top-k agreement reported, not judged")
    return dict(limits)


CHECK = CheckSpec(
    id="logits_agreement",
    summary="the inference path's outputs match the training path's",
    measures={"policy": measure_policy, "causal_lm": measure_causal_lm},
    downstream=True,
    defaults=DEFAULTS,
    feeds_probes=True,
    kinds=("output_shape", "missing_output", "stale_artifact", "artifact_outputs_differ",
           "undeclared_precision", *TRANSFORM_KINDS,
           "log_std_clamp_differs", "target_network_served", "normaliser_missing"),
)

CAUSES: tuple[causes.Explanation, ...] = (
    causes.Explanation(
        "logits_agreement", "served_output_shape", ("output_shape",),
        ("batchnorm_export", "export_integrity", "precision_per_layer", "rollout_parity",
         "batch_invariance", "serving_replay"),
        "the artifact serves an output of another shape than the training policy output (another "
        "head, such as the value head, or another action count)",
        fix="export the output policy.policy_output names (the actor's logits or mean), "
            "under the name the artifact declares",
        rank=175),
    causes.Explanation(
        "logits_agreement", "action_transform",
        ("squash_missing", "action_scale_missing", "action_bias_missing",
         "action_clip_differs", "log_std_clamp_differs"),
        ("head_removal", "batchnorm_export", "export_integrity", "precision_per_layer",
         "rollout_parity"),
        "the serving side turns the policy output (a Gaussian's mean or a deterministic "
        "actor's) into actions differently from training (policy.distribution)",
        fix="apply the declared squash (clip bounds), action scale and bias and log_std clamp "
            "in the served actor, or declare what it serves in policy.distribution",
        only_if=causes.ROLLOUT, rank=180),
    causes.Explanation(
        "logits_agreement", "target_network_served", ("target_network_served",),
        ("batchnorm_export", "export_integrity", "precision_per_layer", "rollout_parity"),
        causes.TARGET_SERVED, fix=causes.TARGET_SERVED_FIX,
        only_if=(("precision_per_layer", causes.artifact_tier_only), *causes.ROLLOUT),
        rank=230),
    causes.Explanation(
        "logits_agreement", "normaliser_missing", ("normaliser_missing",),
        ("batchnorm_export", "export_integrity", "precision_per_layer", "rollout_parity",
         "serving_replay", "batch_invariance"),
        "the artifact computes the network on raw observations: the training model's "
        "observation normaliser is not applied in it (a preprocessing fault)",
        fix="export the module whose forward applies the normaliser (its mean and variance "
            "buffers stored and used), or apply the same normalisation in serving "
            "preprocessing (policy.preprocessing.serving) and export the network alone",
        only_if=(("export_integrity", same_output_gap),
                 ("precision_per_layer", causes.artifact_tier_only), *causes.ROLLOUT,
                 *causes.REPLAY),
        rank=235),
    causes.Explanation(
        "logits_agreement", "artifact_outputs_differ",
        ("stale_artifact", "artifact_outputs_differ", "undeclared_precision"),
        ("batchnorm_export", "export_integrity", "precision_per_layer", "rollout_parity",
         "serving_replay"),
        "the artifact's outputs differ from torch eval (measured by logits_agreement)",
        fix=causes.REEXPORT_FIX,
        only_if=(("export_integrity", same_output_gap),
                 ("precision_per_layer", causes.artifact_tier_only), *causes.ROLLOUT,
                 *causes.REPLAY),
        breaches=("max_abs_diff",), rank=240),
)

POSITION = 80
"""The check's place in the checklist (and in every report): the registry sorts by it."""
