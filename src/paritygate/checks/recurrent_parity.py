"""recurrent_parity: a recurrent policy's artifact matches the training model over sequences.

Both sides step through the same T-step sequences of probe observations with their own
state fed back (``policy.recurrent``), episodes restarting on different rows at different
steps. Free-running errors per step show accumulation; when they go over tolerance, a
teacher-forced pass (the artifact given the training model's incoming state at every step)
tells a wrong step from a state that went wrong earlier and names the cause: state output
shape, swapped state outputs, a missing reset, a wrong initial state, or a state output that
differs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import permutations
from typing import TYPE_CHECKING

import numpy as np

from paritygate.causes import ROLLOUT, Explanation, declared_outputs_only
from paritygate.check import CheckSpec, Thresholds, cause_limit
from paritygate.metrics import finite_report, magnitude_factor, scaled_note
from paritygate.records import Record
from paritygate.result import Measurement

if TYPE_CHECKING:
    from paritygate.engines.base import TensorEngine
    from paritygate.families.policy.context import PolicyContext

DEFAULTS = {
    # Per step, the policy output: the fp32 torch-vs-ONNX Runtime budget of logits_agreement
    # (noise ~2e-6 at logit magnitude ~10). Measured on the recurrent demo over 12 steps: <= 1e-7,
    # without growth; a missing reset or a wrong initial state moves logits by >= 1e-2.
    "max_abs_diff": 2e-5,
    # Per step, every state output (an LSTM's h and c are bounded by 1 and tanh-squashed).
    "state_max_abs_diff": 2e-5,
}

Feeds = dict[str, np.ndarray]


@dataclass(frozen=True)
class StepErrors(Record):
    """The policy-output and state error per step with the state fed back on each side, the
    rows each sequence's episodes start at, and the two sides' names."""

    per_step_max_abs_diff: list[float]
    per_step_state_max_abs_diff: list[float]
    episode_starts: list[list[int]]
    reference: str
    candidate: str


@dataclass(frozen=True)
class TeacherForced(Record):
    """The policy-output error per step with the training side's state fed to both."""

    per_step_teacher_forced_max_abs_diff: list[float]


def _starts(ctx: PolicyContext) -> np.ndarray:
    """(T, B) bool: where sequence b starts an episode at step t."""
    rec = ctx.spec.recurrent
    assert rec is not None
    t = np.arange(rec.steps)[:, None]
    b = np.arange(rec.sequences)[None, :]
    return np.asarray((t == 0) | ((t + b) % rec.reset_every == 0))


def _initial(ctx: PolicyContext, rows: int) -> Feeds:
    return {name: np.repeat(value[None], rows, axis=0)
            for name, value in ctx.initial_states.items()}


class _Steps:
    """The feeds of every step: probe rows cycled through the sequences, the incoming state
    (the initial state where an episode starts, unless the model resets itself on its
    episode-start input) and the episode-start flag."""

    def __init__(self, ctx: PolicyContext, starts: np.ndarray) -> None:
        rec = ctx.spec.recurrent
        assert rec is not None
        self.episode_start = rec.episode_start
        self.starts = starts
        self.inputs = ctx.inputs
        self.n = len(next(iter(ctx.inputs.values())))
        self.initial = _initial(ctx, starts.shape[1])
        self.flags = starts.astype(np.float32)
        b = starts.shape[1]
        self.observations = [{name: value[(t * b + np.arange(b)) % self.n]
                              for name, value in self.inputs.items()}
                             for t in range(starts.shape[0])]

    def feeds(self, step: int, state: Mapping[str, np.ndarray]) -> Feeds:
        feeds = dict(self.observations[step])
        start = self.starts[step]
        for name, initial in self.initial.items():
            incoming = np.asarray(state[name], np.float32)
            if self.episode_start is None and start.any():
                incoming = np.where(start.reshape(-1, *([1] * (incoming.ndim - 1))),
                                    initial, incoming)
            feeds[name] = incoming
        if self.episode_start is not None:
            feeds[self.episode_start] = self.flags[step]
        return feeds


def _next_state(ctx: PolicyContext, outputs: Mapping[str, np.ndarray]) -> Feeds:
    rec = ctx.spec.recurrent
    assert rec is not None
    return {s.input: np.asarray(outputs[s.output], np.float32) for s in rec.states}


def _max_diff(a: np.ndarray, b: np.ndarray) -> float:
    """Max |a - b| in float64; inf for other shapes or any NaN/Inf."""
    if a.shape != b.shape:
        return float("inf")
    if not a.size:
        return 0.0
    d = float(np.max(np.abs(np.subtract(a, b, dtype=np.float64))))
    return d if np.isfinite(d) else float("inf")


def _run(engine: TensorEngine, feeds: Feeds) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in engine.infer(feeds).items()}


def _shape_findings(ctx: PolicyContext, m: Measurement, outputs: Mapping[str, np.ndarray],
                    rows: int) -> bool:
    """Name state outputs that cannot be fed back into their inputs; True when any."""
    rec = ctx.spec.recurrent
    assert rec is not None
    bad = False
    for state in rec.states:
        got = outputs.get(state.output)
        want = [rows, *state.shape]
        if got is None:
            m.fail("state_missing", f"the artifact has no state output {state.output!r}")
            bad = True
        elif list(got.shape) != want:
            m.fail(
                "state_shape",
                f"state shape mismatch: the artifact's state output {state.output!r} has shape "
                f"{list(got.shape)} for a batch of {rows}, but it is fed back as "
                f"{state.input!r} of shape {want} (policy.recurrent.states: {list(state.shape)} "
                "per row, batch on axis 0); an exported (num_layers, batch, hidden) state or a "
                "resized core?")
            bad = True
    return bad


@dataclass
class _Forced:
    """The artifact teacher-forced: given the training model's incoming state at every step."""

    forced: list[float] = field(default_factory=list)
    forced_rest: list[float] = field(default_factory=list)
    """Per step, over the rows that do not start an episode there."""
    forced_state: dict[str, list[float]] = field(default_factory=dict)
    swapped: set[tuple[str, str]] = field(default_factory=set)
    reset_depends: list[int] = field(default_factory=list)
    reset_differs: list[int] = field(default_factory=list)


def _teacher_forced(ctx: PolicyContext, trajectory: list[tuple[Feeds, dict[str, np.ndarray]]],
                    starts: np.ndarray, limit: float, state_limit: float) -> _Forced:
    """Run the artifact on the training model's feeds of every step: per-step differences,
    swapped state outputs, and how it handles episode starts."""
    rec = ctx.spec.recurrent
    assert rec is not None
    names = [s.output for s in rec.states]
    rows = starts.shape[1]
    f = _Forced(forced_state={n: [] for n in names})
    forced, forced_rest, forced_state = f.forced, f.forced_rest, f.forced_state
    swapped, reset_depends, reset_differs = f.swapped, f.reset_depends, f.reset_differs
    for t, (ref_feeds, ref) in enumerate(trajectory):
        teacher = _run(ctx.candidate, ref_feeds)
        forced.append(_max_diff(ref[ctx.output_name], teacher[ctx.output_name]))
        for n in names:
            forced_state[n].append(_max_diff(ref[n], teacher[n]))
        if len(names) > 1:
            for perm in permutations(names):
                if list(perm) != names and all(
                        _max_diff(teacher[a], ref[b]) <= state_limit
                        for a, b in zip(names, perm, strict=True) if a != b):
                    swapped.update((a, b) for a, b in zip(names, perm, strict=True) if a != b)
        reset_rows = starts[t] if t else np.zeros(rows, bool)
        rest = ~starts[t]
        if rest.any():
            forced_rest.append(_max_diff(ref[ctx.output_name][rest],
                                         teacher[ctx.output_name][rest]))
        if reset_rows.any():  # the step after a reset must not depend on the previous episode
            at = {k: v[reset_rows] for k, v in ref_feeds.items()}
            again = dict(at)
            for name, value in _initial(ctx, int(reset_rows.sum())).items():
                again[name] = value if rec.episode_start is not None else at[name]
            fresh = _run(ctx.candidate, again)[ctx.output_name]
            carried = teacher[ctx.output_name][reset_rows]
            if _max_diff(fresh, carried) > limit:
                reset_depends.append(t)
            elif _max_diff(carried, ref[ctx.output_name][reset_rows]) > limit:
                reset_differs.append(t)
    # step 0 is an episode start on every row: its teacher-forced step is the reset step
    if forced[0] > limit and not swapped and 0 not in reset_differs:
        reset_differs.insert(0, 0)
    return f


def _fail_cause(m: Measurement, ctx: PolicyContext, f: _Forced, where: str, limit: float,
                state_limit: float) -> None:
    """Name why the sequences part, from what the teacher-forced run shows."""
    rec = ctx.spec.recurrent
    assert rec is not None
    swapped, forced_rest, forced_state = f.swapped, f.forced_rest, f.forced_state
    reset_depends, reset_differs, forced = f.reset_depends, f.reset_differs, f.forced
    if swapped:
        pairs = sorted({tuple(sorted(p)) for p in swapped})
        text = "; ".join(f"{a!r} and {b!r}" for a, b in pairs)
        m.fail("state_swapped",
               f"state outputs swapped: the artifact's {text} hold each other's values (fed "
               f"back into the wrong inputs from step 1 on); {where}", metric="max_abs_diff")
    elif max(forced_rest, default=0.0) > limit:
        m.fail("step_outputs_differ",
               f"the artifact's single step differs from the training model's by up to "
               f"{max(forced_rest):.3g} given the same observations and incoming state, away "
               "from episode starts too: not a state-handling fault (stale artifact or another "
               f"computation; see logits_agreement and export_integrity); {where}",
               metric="max_abs_diff")
    elif reset_depends:
        how = (f"its episode-start input {rec.episode_start!r} does not reset the state"
               if rec.episode_start else "the state is not reset")
        m.fail("missing_reset",
               f"missing reset: at episode starts (steps {reset_depends[:5]}) the artifact's "
               f"output still depends on the previous episode's state: {how}; {where}",
               metric="max_abs_diff")
    elif reset_differs:
        m.fail("wrong_initial_state",
               f"wrong initial state: at episode starts (steps {reset_differs[:5]}) the "
               "artifact's step does not depend on the previous episode but differs from the "
               f"training model's (another state after a reset than the training model's "
               f"initial state); {where}", metric="max_abs_diff")
    elif any(max(v) > state_limit for v in forced_state.values()):
        worst = max(forced_state, key=lambda n: max(forced_state[n]))
        step = int(np.argmax(forced_state[worst]))
        m.fail("state_outputs_differ",
               f"the artifact's state output {worst!r} differs from the training model's by "
               f"{forced_state[worst][step]:.3g} at step {step} given the same incoming state; "
               f"{where}", metric="state_max_abs_diff")
    else:
        m.fail("sequence_outputs_differ",
               f"artifact outputs differ from the training model's over the sequence: "
               f"{where} (each step alone agrees to {max(forced):.3g}: the error accumulates "
               "through the state)", metric="max_abs_diff")


def measure(ctx: PolicyContext, thresholds: Thresholds) -> Measurement:
    m = Measurement("recurrent_parity")
    rec = ctx.spec.recurrent
    if rec is None:
        return m.skip("not a recurrent policy (policy.recurrent declares no state)")
    starts = _starts(ctx)
    steps, rows = starts.shape
    names = [s.output for s in rec.states]
    plan = _Steps(ctx, starts)
    # the first step shows whether the artifact's state can be fed back at all
    first = plan.feeds(0, plan.initial)
    cand0 = _run(ctx.candidate, first)
    if _shape_findings(ctx, m, cand0, rows):
        m.metric("first_step_over", 0, bad="none", ratchet=False)
        return m

    ref0 = _run(ctx.reference, first)
    factor = magnitude_factor(ref0[ctx.output_name])
    limit = float(thresholds["max_abs_diff"]) * factor
    state_limit = float(thresholds["state_max_abs_diff"])
    if factor > 1:
        m.note(scaled_note({"max_abs_diff": limit}, factor))

    ref_state, cand_state = plan.initial, plan.initial
    free: list[float] = []
    free_state: list[float] = []
    trajectory: list[tuple[Feeds, dict[str, np.ndarray]]] = []
    nonfinite: list[str] = []
    for t in range(steps):  # free-running: each side fed its own state
        ref_feeds = first if t == 0 else plan.feeds(t, ref_state)
        ref = ref0 if t == 0 else _run(ctx.reference, ref_feeds)
        cand = cand0 if t == 0 else _run(ctx.candidate, plan.feeds(t, cand_state))
        for label, out in (("training model", ref), ("artifact", cand)):
            for name in [ctx.output_name, *names]:
                if np.isfinite(out[name]).all():
                    continue
                bad = finite_report(f"{label} output {name!r} at step {t}", out[name])
                if bad and len(nonfinite) < 3:
                    nonfinite.append(bad)
        free.append(_max_diff(ref[ctx.output_name], cand[ctx.output_name]))
        free_state.append(max(_max_diff(ref[n], cand[n]) for n in names))
        trajectory.append((ref_feeds, ref))
        ref_state, cand_state = _next_state(ctx, ref), _next_state(ctx, cand)

    for text in nonfinite:
        m.fail("nonfinite_output", text)
    over = [t for t, d in enumerate(free) if d > limit]
    state_over = [t for t, d in enumerate(free_state) if d > state_limit]
    first_over = min(over + state_over, default=-1)
    m.metric("max_abs_diff", max(free), threshold=limit, key=True)
    m.metric("state_max_abs_diff", max(free_state), threshold=state_limit)
    m.metric("first_step_over", first_over, bad="none", ratchet=False)
    m.metric("error_growth", _growth(free), bad="none", ratchet=False)
    m.metric("steps", steps, bad="none", ratchet=False)
    m.metric("sequences", rows, bad="none", ratchet=False)
    m.record(StepErrors(free, free_state,
                        [[int(b) for b in np.nonzero(row)[0]] for row in starts],
                        ctx.reference.name, f"{ctx.candidate.name} {ctx.artifact_path.name}"))
    marks = sorted({0, steps // 2, steps - 1})
    m.note(f"{steps} steps x {rows} sequences, state fed back; policy-output error per step: "
           + ", ".join(f"step {t} {free[t]:.3g}" for t in marks)
           + f" (error growth {_growth(free):.3g}x)")
    if first_over < 0:
        return m
    # the causes below are calibrated against the defaults: over a tightened limit only, the
    # check fails by the plain breach
    limit = cause_limit(thresholds, "max_abs_diff") * factor
    state_limit = cause_limit(thresholds, "state_max_abs_diff")
    if max(free) <= limit and max(free_state) <= state_limit:
        return m

    f = _teacher_forced(ctx, trajectory, starts, limit, state_limit)
    m.record(TeacherForced(f.forced))
    where = (f"first over tolerance at step {first_over} of {steps} (policy output "
             f"{free[first_over]:.3g}, state {free_state[first_over]:.3g}; last step "
             f"{free[-1]:.3g})")
    _fail_cause(m, ctx, f, where, limit, state_limit)
    return m


def _growth(per_step: list[float]) -> float:
    """Largest error over the sequence's second half / over its first step (1 = no growth)."""
    tail = max(per_step[len(per_step) // 2:])
    head = per_step[0]
    if not np.isfinite(tail) or not np.isfinite(head):
        return float("inf")
    return float(tail / head) if head > 0 else (1.0 if tail == 0 else float("inf"))


CHECK = CheckSpec(
    id="recurrent_parity",
    summary="a recurrent policy's artifact matches the training model over sequences",
    measures={"policy": measure},
    downstream=True,
    defaults=DEFAULTS,
    feeds_probes=True,
    kinds=("state_missing", "state_shape", "state_swapped", "step_outputs_differ",
           "missing_reset",
           "wrong_initial_state", "state_outputs_differ", "sequence_outputs_differ"),
)

CAUSES: tuple[Explanation, ...] = (
    Explanation("recurrent_parity", "recurrent_state",
                ("state_missing", "state_shape", "state_swapped", "state_outputs_differ",
                 "missing_reset", "wrong_initial_state", "sequence_outputs_differ"),
                ("export_integrity", "rollout_parity"),
                "the artifact carries the recurrent state differently from the training model "
                "(named by recurrent_parity)",
                fix="export the new state in the declared order and per-row layout (batch on "
                    "axis 0), reset to the initial state on the episode-start input",
                only_if=(("export_integrity", declared_outputs_only), *ROLLOUT),
                rank=250),
)

POSITION = 90
"""The check's place in the checklist (and in every report): the registry sorts by it."""
