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

import base64
import html
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from paritygate.check import CheckSpec, Rendered, Thresholds, cause_limit
from paritygate.result import CheckResult, Measurement

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

PLOT = "rollout_parity.png"


def _fmt_action(action: Any) -> str:
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


def measure(ctx: PolicyContext, thresholds: Thresholds) -> Measurement:
    m = Measurement("rollout_parity")
    rollouts = ctx.rollouts
    if rollouts is None:
        return m.skip("no policy.rollout section: no environment to step the policy in")
    spec = ctx.spec.rollout
    assert spec is not None
    limits = rollout_limits(ctx, thresholds)
    tie, tol = float(limits["near_tie_margin"] or 0.0), float(limits["action_tolerance"] or 0.0)
    rtol = float(limits["return_tolerance"] or 0.0)
    if limits.note() is not None:
        m.note(str(limits.note()))
    unexcused = excused = unexplained = nonfinite = 0
    agreeing = compared = 0
    obs_drift = 0.0
    action_drift = 0.0
    min_margin = float("inf")
    first_step: int | None = None
    first_margin: float | None = None
    rows: list[dict[str, Any]] = []
    curves: list[dict[str, Any]] = []
    multi = len(ctx.raw_inputs) > 1
    preprocessed = bool(ctx.input_preprocessors)
    recurrent = ctx.spec.recurrent is not None
    for index, (ref, cand) in enumerate(zip(rollouts.reference, rollouts.candidate, strict=True)):
        label = f"episode {index} (seed {ref.seed})"
        for side, ep in (("training path", ref), ("artifact", cand)):
            if ep.nonfinite_step is not None:
                nonfinite += 1
                m.fail("nonfinite_action",
                       f"{label}: the {side}'s policy output holds NaN/Inf at step "
                       f"{ep.nonfinite_step}: no action to take")
        n = min(len(ref.actions), len(cand.actions))
        diff = _action_diff(ref, cand, n, rollouts.discrete)
        apart = np.flatnonzero(diff > (0.0 if rollouts.discrete else tol))
        at = int(apart[0]) if apart.size else None
        agreed = n if at is None else at
        if agreed and rollouts.discrete:
            min_margin = min(min_margin, float(np.min(ref.margins[:agreed])))
        if agreed and not rollouts.discrete:
            action_drift = max(action_drift, float(np.max(diff[:agreed])))
        drift = ref.observation_drift(cand, agreed + 1)
        obs_drift = max(obs_drift, drift)
        agreeing += agreed
        compared += max(ref.length, cand.length)
        d_return = cand.episode_return - ref.episode_return
        row: dict[str, Any] = {
            "episode": index, "seed": ref.seed,
            "training_return": ref.episode_return, "artifact_return": cand.episode_return,
            "training_length": ref.length, "artifact_length": cand.length,
            "first_divergent_step": at, "margin": None, "verdict": "agree",
            "observation_max_abs_diff": drift,
        }
        outcome = f"return {ref.episode_return:.6g} vs {cand.episode_return:.6g}, length " \
                  f"{ref.length} vs {cand.length}"
        if at is not None and drift > thresholds["max_observation_abs_diff"]:
            row["verdict"] = "observations differ"  # the environment parted first
        elif at is not None:
            margin = float(ref.margins[at])
            row.update(margin=None if not np.isfinite(margin) else margin,
                       training_action=_fmt_action(ref.actions[at]),
                       artifact_action=_fmt_action(cand.actions[at]))
            if first_step is None or at < first_step:
                first_step, first_margin = at, (margin if np.isfinite(margin) else None)
            if rollouts.discrete and margin < tie:
                excused += 1
                row["verdict"] = "excused (near-tie)"
                m.note(f"{label}: divergence at step {at} excused, near-tie (margin "
                       f"{margin:.3g} < {_limit(limits, 'near_tie_margin')}); {outcome}")
            else:
                unexcused += 1
                row["verdict"] = "diverged"
                where = ctx.rollout_step_diagnosis(
                    ref.observation(at),
                    ref.incoming_states[at] if ref.incoming_states else None)
                how = (f"logit margin {margin:.3g} >= near-tie tolerance "
                       f"{_limit(limits, 'near_tie_margin')}"
                       if rollouts.discrete else
                       f"action difference {diff[at]:.3g} > action_tolerance "
                       f"{_limit(limits, 'action_tolerance')}")
                m.fail("action_divergence",
                       f"{label}: actions diverge at step {at}: training path "
                       f"{_fmt_action(ref.actions[at])} vs artifact "
                       f"{_fmt_action(cand.actions[at])} ({how}); {outcome}; "
                       f"{_diagnosis(where, preprocessed, multi, recurrent)}",
                       metric="unexcused_divergences")
        elif ref.nonfinite_step is None and cand.nonfinite_step is None and (
                abs(d_return) > rtol * max(1.0, abs(ref.episode_return))
                or ref.length != cand.length):
            unexplained += 1
            row["verdict"] = "return differs"
            m.fail("return_differs",
                   f"{label}: the actions agree at every step but {outcome} (return "
                   f"differs by {abs(d_return):.3g}, return_tolerance "
                   f"{_limit(limits, 'return_tolerance')} relative): the "
                   f"environment is not reproducible under its reset seed",
                   metric="unexplained_return_diffs")
        rows.append(row)
        curves.append({
            "episode": index, "seed": ref.seed, "first_divergent_step": at,
            "action_diff": [float(v) for v in diff],
            "training_return": np.cumsum(ref.rewards).tolist(),
            "artifact_return": np.cumsum(cand.rewards).tolist(),
        })
    limit = float(limits["max_observation_abs_diff"] or 0.0)
    if obs_drift > max(limit, cause_limit(thresholds, "max_observation_abs_diff")):
        worst = max(rows, key=lambda r: float(r["observation_max_abs_diff"]))
        m.fail("trajectory_differs",
               f"episode {worst['episode']} (seed {worst['seed']}): observations differ by up "
               f"to {obs_drift:.3g} while the actions still agree (limit "
               f"{_limit(limits, 'max_observation_abs_diff')}): the "
               "environment is not reproducible under its reset seed, or sub-tolerance action "
               "differences compound", metric="max_observation_abs_diff")
    m.metric("unexcused_divergences", unexcused, threshold=thresholds["unexcused_divergences"],
             key=True)
    m.metric("excused_divergences", excused, bad="none")
    m.metric("unexplained_return_diffs", unexplained,
             threshold=thresholds["unexplained_return_diffs"])
    m.metric("max_observation_abs_diff", obs_drift, threshold=limit)
    m.metric("nonfinite_actions", nonfinite, threshold=thresholds["nonfinite_actions"])
    m.metric("action_agreement", agreeing / compared if compared else 1.0, bad="lower",
             ratchet=False)
    m.metric("first_divergent_step", first_step, bad="none", ratchet=False)
    m.metric("divergence_margin", first_margin, bad="none", ratchet=False)
    returns = [abs(r["artifact_return"] - r["training_return"]) for r in rows]
    lengths = [abs(r["artifact_length"] - r["training_length"]) for r in rows]
    m.metric("max_return_abs_diff", max(returns, default=0.0), bad="none", ratchet=False)
    m.metric("max_length_diff", max(lengths, default=0), bad="none", ratchet=False)
    if rollouts.discrete:
        m.metric("min_action_margin", min_margin if np.isfinite(min_margin) else None,
                 bad="none", ratchet=False)
    else:
        m.metric("max_action_abs_diff", action_drift, bad="none", ratchet=False)
    m.metric("episodes", len(rows), bad="none", ratchet=False)
    m.metric("steps", sum(r["training_length"] for r in rows), bad="none", ratchet=False)
    m.details.update(env=rollouts.env, episodes=rows, curves=curves,
                     actions="discrete (argmax)" if rollouts.discrete else
                     "continuous (clipped to the action space)")
    return m


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


# --- report: a per-step plot and a table per episode --------------------------------------------


def _table(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    header = ["episode", "seed", "return (training / artifact)", "length (training / artifact)",
              "first divergent step", "margin", "actions there", "verdict"]

    def num(v: Any) -> str:
        return "-" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))

    cells = [[
        str(r["episode"]), str(r["seed"]),
        f"{num(r['training_return'])} / {num(r['artifact_return'])}",
        f"{r['training_length']} / {r['artifact_length']}",
        num(r["first_divergent_step"]), num(r.get("margin")),
        (f"{r['training_action']} / {r['artifact_action']}" if "training_action" in r else "-"),
        str(r["verdict"]),
    ] for r in rows]
    return header, cells


def _plot(curves: list[dict[str, Any]], path: Path, title: str) -> Path | None:
    try:
        from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global state
    except ImportError:
        return None
    from paritygate.files import atomic_savefig

    fig = Figure(figsize=(7.0, 5.0))
    top, bottom = fig.subplots(2, 1, sharex=True)
    colours = [f"C{i % 10}" for i in range(len(curves))]
    for curve, colour in zip(curves, colours, strict=True):
        label = f"ep {curve['episode']} (seed {curve['seed']})"
        diff = curve["action_diff"]
        at = curve.get("first_divergent_step")
        # compared up to the first divergence; after it the paths see other states (faint)
        cut = len(diff) if at is None else at + 1
        top.step(range(cut), diff[:cut], where="post", color=colour, label=label,
                 linewidth=1.2)
        if at is not None:
            top.plot([at], [diff[at]], marker="x", color=colour, markersize=8)
            top.step(range(at, len(diff)), diff[at:], where="post", color=colour,
                     linewidth=0.8, alpha=0.25)
        for key, style, face in (("training_return", "-", colour),
                                 ("artifact_return", "--", "white")):
            series = curve[key]
            bottom.plot(series, color=colour, linewidth=1.2, linestyle=style)
            if series:  # the episode's end
                bottom.plot([len(series) - 1], [series[-1]], marker="o", color=colour,
                            markerfacecolor=face, markersize=5)
    top.set_ylabel("action difference")
    top.set_title(f"{title} (x: first divergent step; faint: not compared)")
    top.legend(fontsize=7, loc="upper right")
    bottom.set_ylabel("cumulative return")
    bottom.set_xlabel("step")
    bottom.plot([], [], color="black", label="training path")
    bottom.plot([], [], color="black", linestyle="--", label="artifact")
    bottom.legend(fontsize=7, loc="upper left")
    fig.subplots_adjust(left=0.11, right=0.97, top=0.93, bottom=0.1, hspace=0.12)
    return atomic_savefig(fig, path, dpi=90)


def render(result: CheckResult, report_dir: Path) -> Rendered:
    """rollout_parity.png (per-step action difference and cumulative return of both paths)
    and a table per episode, for report.md and report.html."""
    rows = result.details.get("episodes")
    if not rows:
        return Rendered()
    header, cells = _table(rows)
    md = "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
                    *("| " + " | ".join(c) + " |" for c in cells)])
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
                   for row in cells)
    title = f"rollout_parity: {result.details.get('env', '')}"
    png = _plot(result.details.get("curves") or [], Path(report_dir) / PLOT, title)
    image = ""
    if png is not None:
        encoded = base64.b64encode(png.read_bytes()).decode()
        image = (f'<img alt="per-step action difference and cumulative return" '
                 f'src="data:image/png;base64,{encoded}"/>')
    fragment = (f'<section class="rollout"><h3>Rollouts</h3>{image}'
                f"<table><tr>{head}</tr>{body}</table></section>")
    return Rendered(markdown=md, html=fragment, files=[str(png)] if png is not None else [])


CHECK = CheckSpec(
    id="rollout_parity",
    summary="the served policy acts the same as the trained one in its environment",
    measures={"policy": measure},
    defaults=DEFAULTS,
    marks=("fast",),
    render=render,
    kinds=("action_divergence", "return_differs", "trajectory_differs", "nonfinite_action"),
)
