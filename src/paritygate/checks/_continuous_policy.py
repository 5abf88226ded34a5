"""A continuous policy's served actions and Gaussian, measured for ``logits_agreement``: the
deterministic env actions of both sides, the std, KL and behaviour log-prob of the two
Gaussians, and the action transform (squash, scale, bias, clip, log-std clamp) the artifact
skipped or changed, named by its kind."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from paritygate.metrics import finite_report, magnitude_factor
from paritygate.metrics.gaussian import (
    Gaussian,
    behaviour_logprob_delta,
    gaussian,
    kl_per_row,
    scale_bias,
)
from paritygate.records import Record

if TYPE_CHECKING:
    from paritygate.config.policy import DistributionSpec
    from paritygate.families.policy.context import PolicyContext
    from paritygate.result import Measurement

TRANSFORM_KINDS = ("squash_missing", "action_scale_missing", "action_bias_missing",
                   "action_clip_differs")


@dataclass(frozen=True)
class Distribution(Record):
    """The Gaussian head as the check read it."""

    squash: str
    log_std: str
    samples_per_probe: int


@dataclass(frozen=True)
class GaussianRecord(Record):
    """logits_agreement's record of a Gaussian (continuous-action) policy."""

    distribution: Distribution


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
    m.record(GaussianRecord(Distribution(dist.squash, dist.log_std, dist.samples)))
    return found[0] if found else None
