"""rollout_parity: the served policy acts the same as the trained one in its environment.

``policy.rollout`` names a Gymnasium environment and the reset seeds of N episodes. Each
episode is stepped twice, closed loop, each path in its own copy of the environment: once
by the training path (training preprocessing, the training model) and once by the serving
path (serving preprocessing, the ONNX artifact). A Dict observation is split into the
declared inputs (each key through its own preprocessing); a recurrent policy's state is fed
back on each path step by step, reset at every episode start (through its episode-start
input when it declares one, as served). Actions are deterministic (argmax of
discrete logits; continuous outputs clipped to the action space). Per episode the check
reports the first divergent step and the action margin there, the share of steps the paths
agreed on, the difference in return and length, and how far the observation trajectories
drifted while the actions still agreed. A discrete divergence is excused only at a near-tie:
the training path's top-1 minus top-2 logit margin below ``policy.rollout.near_tie_margin``
(after it the paths see different states, so the rest of that episode is not compared). A
continuous step agrees while the actions differ by at most ``policy.rollout.action_tolerance``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from paritygate.check import CheckSpec, Thresholds, cause_limit
from paritygate.records import OMIT_NONE, Record
from paritygate.result import Measurement

if TYPE_CHECKING:
    from paritygate.families.policy.context import PolicyContext
    from paritygate.families.policy.rollout import Episode, StepDiagnosis
    from paritygate.metrics.tiers import Limits

DEFAULTS: dict[str, float] = {
    # Deterministic actions from two fp32 paths agree at every step outside near-ties.
    "unexcused_divergences": 0.0,
    # Same actions from the same seed give the same return and length: a difference means the
    # environment is not reproducible under its seed (or sub-tolerance action noise compounds).
    "unexplained_return_diffs": 0.0,
    # Raw observations while the actions agree: bitwise equal for discrete actions; fp32 noise
    # of continuous actions (~1e-6) moves Pendulum's states by < 1e-5 over 200 steps.
    "max_observation_abs_diff": 1e-3,
    "nonfinite_actions": 0.0,
}

def _fmt_action(action: object) -> str:
    arr = np.asarray(action)
    if arr.ndim == 0:
        return str(arr.item())
    return "[" + ", ".join(f"{v:.4g}" for v in arr.ravel()) + "]"


def _action_diff(ref: Episode, cand: Episode, n: int, discrete: bool) -> np.ndarray:
    """(n,) per-step difference: 1/0 for discrete actions, max abs difference for continuous."""
    a: np.ndarray = np.asarray(ref.actions[:n])
    b: np.ndarray = np.asarray(cand.actions[:n])
    if discrete:
        flips: np.ndarray = (a != b).astype(np.float64)
        return flips
    diff = np.abs(a.astype(np.float64) - b.astype(np.float64)).reshape(n, -1)
    out: np.ndarray = diff.max(axis=1) if n else np.zeros(0)
    return out


def rollout_limits(ctx: PolicyContext, thresholds: Thresholds) -> Limits:
    """``near_tie_margin``, ``action_tolerance``, ``return_tolerance`` and
    ``max_observation_abs_diff`` for the artifact's declared precision
    (``policy.artifact_dtype``): :func:`paritygate.metrics.tiers.judged_limits`, so a float16
    artifact's steps are judged by the tier ``logits_agreement`` uses; values set under
    ``policy.rollout`` (or ``thresholds.rollout_parity``) win."""
    from paritygate.metrics.tiers import judged_limits, tier_for

    spec = ctx.spec.rollout
    assert spec is not None
    declared = ctx.spec.artifact_dtype
    tier = None if declared == "float32" else tier_for("float32", declared)
    defaults: dict[str, float | None] = {
        "near_tie_margin": spec.near_tie_margin, "action_tolerance": spec.action_tolerance,
        "return_tolerance": spec.return_tolerance,
        "max_observation_abs_diff": thresholds["max_observation_abs_diff"]}
    user_set = spec.model_fields_set & set(defaults)
    if thresholds.is_set("max_observation_abs_diff"):
        user_set.add("max_observation_abs_diff")
    return judged_limits(tier, defaults, user_set,
                         declared_by=f"policy.artifact_dtype {declared}")


def _limit(limits: Limits, name: str) -> str:
    """A limit for a message: ``0.001``, or ``0.0442 (fp16/fp32 tier; default 0.001 for
    fp32)`` where a tier set it."""
    return f"{limits[name]:g}" if limits.tier is None else limits.describe(name)


@dataclass(frozen=True)
class EpisodeRow(Record):
    """One episode of both paths, as the report's table shows it."""

    episode: int
    seed: int
    training_return: float
    artifact_return: float
    training_length: int
    artifact_length: int
    first_divergent_step: int | None
    margin: float | None
    verdict: str
    observation_max_abs_diff: float
    training_action: str | None = field(default=None, metadata=OMIT_NONE)
    """Both paths' actions at the first divergent step (left out when none parted)."""
    artifact_action: str | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True)
class EpisodeCurve(Record):
    """One episode's per-step action difference and both paths' cumulative returns."""

    episode: int
    seed: int
    first_divergent_step: int | None
    action_diff: list[float]
    training_return: list[float]
    artifact_return: list[float]


@dataclass(frozen=True)
class RolloutRecord(Record):
    """The environment, a row and a curve per episode, and how actions were compared."""

    env: str
    episodes: list[EpisodeRow]
    curves: list[EpisodeCurve]
    actions: str


@dataclass
class _Tally:
    """What the episodes add up to, filled one episode at a time."""

    unexcused: int = 0
    excused: int = 0
    unexplained: int = 0
    nonfinite: int = 0
    agreeing: int = 0
    compared: int = 0
    obs_drift: float = 0.0
    action_drift: float = 0.0
    min_margin: float = float("inf")
    first_step: int | None = None
    first_margin: float | None = None
    rows: list[EpisodeRow] = field(default_factory=list)
    curves: list[EpisodeCurve] = field(default_factory=list)


@dataclass(frozen=True)
class _Judge:
    """What one episode is judged with: the limits and the path's shape for diagnoses."""

    ctx: PolicyContext
    limits: Limits
    observation_limit: float
    discrete: bool

    @property
    def tie(self) -> float:
        return float(self.limits["near_tie_margin"] or 0.0)

    @property
    def tol(self) -> float:
        return float(self.limits["action_tolerance"] or 0.0)


def measure(ctx: PolicyContext, thresholds: Thresholds) -> Measurement:
    m = Measurement("rollout_parity")
    rollouts = ctx.rollouts
    if rollouts is None:
        return m.skip("no policy.rollout section: no environment to step the policy in")
    assert ctx.spec.rollout is not None
    limits = rollout_limits(ctx, thresholds)
    if limits.note() is not None:
        m.note(str(limits.note()))
    judge = _Judge(ctx, limits, thresholds["max_observation_abs_diff"], rollouts.discrete)
    tally = _Tally()
    for index, (ref, cand) in enumerate(zip(rollouts.reference, rollouts.candidate, strict=True)):
        _episode(m, judge, tally, index, ref, cand)
    limit = float(limits["max_observation_abs_diff"] or 0.0)
    if tally.obs_drift > max(limit, cause_limit(thresholds, "max_observation_abs_diff")):
        worst = max(tally.rows, key=lambda r: float(r.observation_max_abs_diff))
        m.fail("trajectory_differs",
               f"episode {worst.episode} (seed {worst.seed}): observations differ by up "
               f"to {tally.obs_drift:.3g} while the actions still agree (limit "
               f"{_limit(limits, 'max_observation_abs_diff')}): the "
               "environment is not reproducible under its reset seed, or sub-tolerance action "
               "differences compound", metric="max_observation_abs_diff")
    _metrics(m, tally, thresholds, limit, rollouts.discrete)
    m.record(RolloutRecord(rollouts.env, list(tally.rows), list(tally.curves),
                           "discrete (argmax)" if rollouts.discrete else
                           "continuous (clipped to the action space)"))
    return m


def _episode(m: Measurement, judge: _Judge, tally: _Tally, index: int, ref: Episode,
             cand: Episode) -> None:
    """Compare one episode of both paths: fail or excuse its divergence, add it to ``tally``."""
    label = f"episode {index} (seed {ref.seed})"
    for side, ep in (("training path", ref), ("artifact", cand)):
        if ep.nonfinite_step is not None:
            tally.nonfinite += 1
            m.fail("nonfinite_action",
                   f"{label}: the {side}'s policy output holds NaN/Inf at step "
                   f"{ep.nonfinite_step}: no action to take")
    n = min(len(ref.actions), len(cand.actions))
    diff = _action_diff(ref, cand, n, judge.discrete)
    apart = np.flatnonzero(diff > (0.0 if judge.discrete else judge.tol))
    at = int(apart[0]) if apart.size else None
    agreed = n if at is None else at
    if agreed and judge.discrete:
        tally.min_margin = min(tally.min_margin, float(np.min(ref.margins[:agreed])))
    if agreed and not judge.discrete:
        tally.action_drift = max(tally.action_drift, float(np.max(diff[:agreed])))
    drift = ref.observation_drift(cand, agreed + 1)
    tally.obs_drift = max(tally.obs_drift, drift)
    tally.agreeing += agreed
    tally.compared += max(ref.length, cand.length)
    row = EpisodeRow(
        episode=index, seed=ref.seed, training_return=ref.episode_return,
        artifact_return=cand.episode_return, training_length=ref.length,
        artifact_length=cand.length, first_divergent_step=at, margin=None, verdict="agree",
        observation_max_abs_diff=drift)
    if at is not None and drift > judge.observation_limit:
        row = replace(row, verdict="observations differ")  # the environment parted first
    elif at is not None:
        row = _divergence(m, judge, tally, row, label, ref, cand, diff)
    elif ref.nonfinite_step is None and cand.nonfinite_step is None:
        row = _same_actions(m, judge, tally, row, label)
    tally.rows.append(row)
    tally.curves.append(EpisodeCurve(
        episode=index, seed=ref.seed, first_divergent_step=at,
        action_diff=[float(v) for v in diff],
        training_return=np.cumsum(ref.rewards).tolist(),
        artifact_return=np.cumsum(cand.rewards).tolist()))


def _outcome(row: EpisodeRow) -> str:
    return (f"return {row.training_return:.6g} vs {row.artifact_return:.6g}, length "
            f"{row.training_length} vs {row.artifact_length}")


def _divergence(m: Measurement, judge: _Judge, tally: _Tally, row: EpisodeRow, label: str,
                ref: Episode, cand: Episode, diff: np.ndarray) -> EpisodeRow:
    """The actions part at ``row.first_divergent_step``: excused at a near-tie, else failed
    with where the serving path parts from training."""
    at = row.first_divergent_step
    assert at is not None
    limits, ctx = judge.limits, judge.ctx
    margin = float(ref.margins[at])
    row = replace(row, margin=None if not np.isfinite(margin) else margin,
                  training_action=_fmt_action(ref.actions[at]),
                  artifact_action=_fmt_action(cand.actions[at]))
    if tally.first_step is None or at < tally.first_step:
        tally.first_step, tally.first_margin = at, (margin if np.isfinite(margin) else None)
    if judge.discrete and margin < judge.tie:
        tally.excused += 1
        m.note(f"{label}: divergence at step {at} excused, near-tie (margin "
               f"{margin:.3g} < {_limit(limits, 'near_tie_margin')}); {_outcome(row)}")
        return replace(row, verdict="excused (near-tie)")
    tally.unexcused += 1
    where = ctx.rollout_step_diagnosis(
        ref.observation(at), ref.incoming_states[at] if ref.incoming_states else None)
    how = (f"logit margin {margin:.3g} >= near-tie tolerance "
           f"{_limit(limits, 'near_tie_margin')}"
           if judge.discrete else
           f"action difference {diff[at]:.3g} > action_tolerance "
           f"{_limit(limits, 'action_tolerance')}")
    diagnosis = _diagnosis(where, bool(ctx.input_preprocessors), len(ctx.raw_inputs) > 1,
                           ctx.spec.recurrent is not None)
    m.fail("action_divergence",
           f"{label}: actions diverge at step {at}: training path "
           f"{row.training_action} vs artifact {row.artifact_action} ({how}); "
           f"{_outcome(row)}; {diagnosis}", metric="unexcused_divergences")
    return replace(row, verdict="diverged")


def _same_actions(m: Measurement, judge: _Judge, tally: _Tally, row: EpisodeRow, label: str
                  ) -> EpisodeRow:
    """The actions agree at every step: the returns and lengths must too."""
    d_return = row.artifact_return - row.training_return
    rtol = float(judge.limits["return_tolerance"] or 0.0)
    if not (abs(d_return) > rtol * max(1.0, abs(row.training_return))
            or row.training_length != row.artifact_length):
        return row
    tally.unexplained += 1
    m.fail("return_differs",
           f"{label}: the actions agree at every step but {_outcome(row)} (return "
           f"differs by {abs(d_return):.3g}, return_tolerance "
           f"{_limit(judge.limits, 'return_tolerance')} relative): the "
           f"environment is not reproducible under its reset seed",
           metric="unexplained_return_diffs")
    return replace(row, verdict="return differs")


def _metrics(m: Measurement, tally: _Tally, thresholds: Thresholds, limit: float,
             discrete: bool) -> None:
    rows = tally.rows
    m.metric("unexcused_divergences", tally.unexcused,
             threshold=thresholds["unexcused_divergences"], key=True)
    m.metric("excused_divergences", tally.excused, bad="none")
    m.metric("unexplained_return_diffs", tally.unexplained,
             threshold=thresholds["unexplained_return_diffs"])
    m.metric("max_observation_abs_diff", tally.obs_drift, threshold=limit)
    m.metric("nonfinite_actions", tally.nonfinite, threshold=thresholds["nonfinite_actions"])
    m.metric("action_agreement", tally.agreeing / tally.compared if tally.compared else 1.0,
             bad="lower", ratchet=False)
    m.metric("first_divergent_step", tally.first_step, bad="none", ratchet=False)
    m.metric("divergence_margin", tally.first_margin, bad="none", ratchet=False)
    returns = [abs(r.artifact_return - r.training_return) for r in rows]
    lengths = [abs(r.artifact_length - r.training_length) for r in rows]
    m.metric("max_return_abs_diff", max(returns, default=0.0), bad="none", ratchet=False)
    m.metric("max_length_diff", max(lengths, default=0), bad="none", ratchet=False)
    if discrete:
        m.metric("min_action_margin",
                 tally.min_margin if np.isfinite(tally.min_margin) else None,
                 bad="none", ratchet=False)
    else:
        m.metric("max_action_abs_diff", tally.action_drift, bad="none", ratchet=False)
    m.metric("episodes", len(rows), bad="none", ratchet=False)
    m.metric("steps", sum(r.training_length for r in rows), bad="none", ratchet=False)


def _diagnosis(where: StepDiagnosis, preprocessed: bool, multi: bool, recurrent: bool
               ) -> str:
    """Which half of the serving path parts from training at the divergent observation."""
    inputs, outputs = where.input_max_abs_diff, where.output_max_abs_diff
    parts = []
    if preprocessed:
        key = f" {where.worst_input!r}" if multi else ""
        parts.append(f"serving preprocessing's model input{key} differs by {inputs:.3g}")
    given = " and the training path's state" if recurrent else ""
    parts.append(f"the artifact's output on the training model input{given} differs by "
                 f"{outputs:.3g}")
    return "at that observation " + " and ".join(parts)


CHECK = CheckSpec(
    id="rollout_parity",
    summary="the served policy acts the same as the trained one in its environment",
    measures={"policy": measure},
    downstream=True,
    defaults=DEFAULTS,
    marks=("fast",),
    kinds=("action_divergence", "return_differs", "trajectory_differs", "nonfinite_action"),
)

POSITION = 180
"""The check's place in the checklist (and in every report): the registry sorts by it."""
