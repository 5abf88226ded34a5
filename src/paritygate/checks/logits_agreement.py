"""logits_agreement: the inference path's outputs match the training path's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, cast

import numpy as np

from paritygate.check import CheckSpec, Thresholds
from paritygate.checks._registration.logits_agreement import CAUSES as CAUSES
from paritygate.checks._registration.logits_agreement import POSITION as POSITION
from paritygate.metrics import (
    LogitsComparison,
    diff_stats,
    distribution_stats,
    finite_report,
    magnitude_factor,
    scaled_note,
)
from paritygate.metrics.gaussian import (
    Gaussian,
    behaviour_logprob_delta,
    gaussian,
    kl_per_row,
    scale_bias,
)
from paritygate.metrics.tiers import tier_thresholds
from paritygate.result import Measurement

if TYPE_CHECKING:
    from paritygate.engines.hf_generate import HFGenerateEngine
    from paritygate.families.causal_lm.context import LMContext
    from paritygate.families.policy.config import DistributionSpec
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
    m.details["worst_probes"] = [
        {"probe": int(i), "max_abs_diff": float(rows[i]),
         "kl": float(kl_rows[i]) if kl_rows else None,
         "reference_argmax": int(np.argmax(reference[i])),
         "candidate_argmax": int(np.argmax(candidate[i]))}
        for i in order
    ]
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
            m.details["normaliser_missing"] = {"module": skipped.module,
                                               "statistics": skipped.statistics}
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
    m.details["reference"] = ctx.reference.name
    m.details["candidate"] = f"{ctx.candidate.name} {ctx.artifact_path.name}"
    return m


_TRANSFORM_KINDS = ("squash_missing", "action_scale_missing", "action_bias_missing",
                    "action_clip_differs")


def _held(values: np.ndarray) -> str:
    """The value(s) a clip holds actions at: one, or their range."""
    lo, hi = float(values.min()), float(values.max())
    return f"{lo:.4g}" if hi - lo <= 1e-6 * max(1.0, abs(hi)) else f"{lo:.4g} to {hi:.4g}"


def _clip_transform(dist: DistributionSpec, mean: np.ndarray, served: np.ndarray,
                    tol: float) -> tuple[str, str] | None:
    """Name a clip bound that differs: the served actions are the mean clipped at the values
    they are held at (per dimension) instead of the declared ``bias -/+ scale``."""
    scale, bias = scale_bias(dist, mean.shape[-1])
    declared = (f"the declared clip is [{_held(bias - np.abs(scale))}, "
                f"{_held(bias + np.abs(scale))}] (bias -/+ scale, squash: clip)")
    if np.max(np.abs(served - mean)) <= tol:
        return "action_clip_differs", f"the artifact does not clip the action where {declared}"
    if np.max(np.abs(np.clip(mean, served.min(0), served.max(0)) - served)) > tol:
        return None
    upper, lower = served[served < mean - tol], served[served > mean + tol]
    held = [f"at {_held(upper)} from above"] if upper.size else []
    held += [f"at {_held(lower)} from below"] if lower.size else []
    return ("action_clip_differs", f"the action clip bound differs: the artifact clips the "
            f"mean {' and '.join(held)} where {declared}")


def _action_transform(dist: DistributionSpec, mean: np.ndarray, served: np.ndarray,
                      tol: float) -> tuple[str, str] | None:
    """Name an env-action transform the artifact skipped or changed: ``(kind, text)`` or
    ``None``."""
    if dist.squash == "clip":
        return _clip_transform(dist, mean, served, tol)
    scale, bias = scale_bias(dist, mean.shape[-1])
    unit = np.tanh(mean) if dist.squash == "tanh" else mean
    hypotheses = [("action_scale_missing", bias + unit, "the action scale is not applied "
                   "(action = bias + squash(mean))"),
                  ("action_bias_missing", scale * unit, "the action bias is not applied "
                   "(action = scale * squash(mean))")]
    if dist.squash == "tanh":
        hypotheses.insert(0, ("squash_missing", bias + scale * mean,
                              "the tanh squash is missing on the serving side "
                              "(action = bias + scale * mean)"))
    hypotheses.append(("action_scale_missing", unit, "neither the action scale nor the bias is "
                       "applied (action = squash(mean))"))
    for kind, expected, text in hypotheses:
        if np.max(np.abs(expected - served)) <= tol:
            return kind, text
    return None


def _clamp_cause(reference: Gaussian, candidate: np.ndarray, differs: np.ndarray,
                 declared: list[float] | None) -> str | None:
    """Another log-std clamp on one side, where the two log-stds differ: the artifact's held
    at one value the training model's goes past (a tighter serving clamp), or the training
    model's held at its clamp while the artifact's goes past it (a looser or missing one)."""
    held, past = candidate[differs], reference.raw_log_std[differs]
    side = f"declared log_std_clamp {declared}"
    if held.size and float(np.ptp(held)) <= 1e-6:
        beyond = float(past.min() if past.min() < held[0] else past.max())
        return (f"log_std clamp differs: the artifact's log_std is held at {held[0]:.4g} "
                f"where the training model's is {beyond:.4g} ({side})")
    clamped = reference.log_std[differs]
    if clamped.size and float(np.ptp(clamped)) <= 1e-6:
        beyond = float(held.min() if held.min() < clamped[0] else held.max())
        return (f"log_std clamp differs: the training model's log_std is held at "
                f"{clamped[0]:.4g} where the artifact's goes to {beyond:.4g}, so the serving "
                f"clamp is looser or missing ({side})")
    return None


def measure_action(m: Measurement, ctx: PolicyContext, dist: DistributionSpec,
                   mean: np.ndarray, candidate: np.ndarray,
                   limits: Mapping[str, float | None]) -> str | None:
    """The deterministic env actions of both sides (``action_max_abs_diff``) and, when the
    artifact serves actions, a missing squash, scale or bias named by its kind (returned)."""
    mean = np.asarray(mean, np.float64)
    scale, _ = scale_bias(dist, mean.shape[-1])
    action_limit = float(limits.get("action_max_abs_diff") or 0.0) * max(
        1.0, float(np.max(np.abs(scale)))) * magnitude_factor(mean)
    ref_action = ctx.deterministic_action(mean)
    cand_action = ctx.deterministic_action(candidate, served=True)
    action_diff = float(np.max(np.abs(ref_action - cand_action))) if ref_action.size else 0.0
    m.metric("action_max_abs_diff", action_diff, threshold=limits.get("action_max_abs_diff")
             and action_limit)
    if dist.serving_output != "action" or action_diff <= action_limit:
        return None
    found = _action_transform(dist, mean, np.asarray(candidate, np.float64), 10 * action_limit)
    if found is None:
        return None
    m.fail(found[0], f"deterministic actions differ by up to {action_diff:.3g}: {found[1]}",
           metric="action_max_abs_diff")
    return found[0]


def measure_gaussian(m: Measurement, ctx: PolicyContext, dist: DistributionSpec,
                     candidate: np.ndarray, limits: Mapping[str, float | None]
                     ) -> str | None:
    """The distribution metrics of a continuous policy; the kind of a named action-transform
    fault, or ``None``."""
    ref: Gaussian = ctx.reference_gaussian()
    kind = measure_action(m, ctx, dist, ref.mean, candidate, limits)
    found = (kind, "") if kind is not None else None
    cand_log_std = ctx.candidate_log_std()
    if cand_log_std is None:
        m.note("the artifact serves no log_std: the std, KL and log-prob metrics need it")
        return found[0] if found else None
    bad = finite_report("candidate log_std", cand_log_std)
    if bad:
        m.fail("nonfinite_output", bad)
        return found[0] if found else None
    cand_mean = ref.mean if dist.serving_output == "action" else candidate
    # The declared clamp is the training side's (its raw output needs it); a log-std the
    # artifact serves is compared as served, so a serving clamp that differs shows.
    cand = gaussian(dist, cand_mean, cand_log_std, clamp=dist.log_std == "parameter")
    std_gap = np.abs(ref.std - cand.std)
    std_limit = float(limits.get("std_max_abs_diff") or 0.0)
    m.metric("std_max_abs_diff", float(std_gap.max()) if std_gap.size else 0.0,
             threshold=limits.get("std_max_abs_diff"))
    if std_gap.size and std_gap.max() > std_limit:
        clamp = _clamp_cause(ref, cand.log_std, std_gap > std_limit, dist.log_std_clamp)
        if clamp is not None:
            m.fail("log_std_clamp_differs",
                   f"{clamp}; std differs by up to {float(std_gap.max()):.3g}",
                   metric="std_max_abs_diff")
            found = found or ("log_std_clamp_differs", "")
    if dist.serving_output == "action":
        m.note("the artifact serves actions: KL and the behaviour log-prob need its mean")
        return found[0] if found else None
    kl = kl_per_row(ref, cand)
    m.metric("gaussian_kl_max", float(kl.max()) if kl.size else 0.0,
             threshold=limits.get("gaussian_kl_max"))
    m.metric("gaussian_kl_mean", float(kl.mean()) if kl.size else 0.0, bad="none",
             ratchet=False)
    delta = behaviour_logprob_delta(dist, cand, ref, ctx.config.seed)
    m.metric("logprob_delta_max_abs", float(np.abs(delta).max()) if delta.size else 0.0,
             threshold=limits.get("logprob_delta_max_abs"))
    m.metric("logprob_delta_mean", float(delta.mean()) if delta.size else 0.0, bad="none",
             ratchet=False)
    m.details["distribution"] = {"squash": dist.squash, "log_std": dist.log_std,
                                 "samples_per_probe": dist.samples}
    return found[0] if found else None


def measure_causal_lm(ctx: LMContext, thresholds: Thresholds) -> Measurement:
    m = Measurement("logits_agreement")
    if "hf" not in ctx.spec.engines:
        if "vllm" not in ctx.spec.engines:
            return m.skip("logits_agreement needs the served model's logits: the HF engine "
                          "or vLLM's prompt log-probs (engines has neither)")
        found = ctx.vllm_served_rows()
        if isinstance(found, str):
            return m.skip(found)
        m.details["candidate"] = (f"vLLM prompt log-probs ({ctx.spec.engine.dtype}, teacher-"
                                  "forced on its greedy continuations, in the trainer's gauge)")
        return _judge(ctx, m, thresholds, *found)
    generation = ctx.greedy("hf")
    assert generation is not None  # only a rollout dump may lack a greedy record
    kept = [i for i, output in enumerate(generation.output_ids) if output]
    teacher = ctx.teacher_forced(generation)  # shared with generation_parity
    engine = cast("HFGenerateEngine", ctx.engine("hf"))
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
    m.details["candidate"] = f"HF engine model ({ctx.spec.engine.dtype}, KV cache)"
    return _judge(ctx, m, thresholds, np.concatenate(refs), np.concatenate(cands), owners)


def _judge(ctx: LMContext, m: Measurement, thresholds: Thresholds, reference: np.ndarray,
           candidate: np.ndarray, owners: list[str]) -> Measurement:
    """The trainer's ``(N, V)`` logits against the served ones, by the precision tier."""
    limits = _tier_thresholds(ctx, m, thresholds)
    stats = compare_logits(m, reference, candidate, limits)
    if stats is not None:  # the size of the gap names no cause: the usual ones, for people
        m.hint("max_abs_diff",
               f"cached engine logits differ from the trainer's forward (engine "
               f"{ctx.engine_model_dir.name} in {ctx.spec.engine.dtype}, trainer in "
               f"{ctx.spec.training.dtype}); possible causes: stale checkpoint, lower precision "
               "or a cache bug")
    for row in m.details.get("worst_probes", []):
        row["position"] = owners[row["probe"]]
    m.metric("rows", len(reference), bad="none", ratchet=False)
    m.details["reference"] = f"training model ({ctx.spec.training.dtype}, teacher-forced, no cache)"
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
    defaults=DEFAULTS,
    feeds_probes=True,
    kinds=("output_shape", "missing_output", "stale_artifact", "artifact_outputs_differ",
           "undeclared_precision", *_TRANSFORM_KINDS,
           "log_std_clamp_differs", "target_network_served", "normaliser_missing"),
)
