"""Closed-loop episodes of a policy in a Gymnasium environment (``policy.rollout``).

Each path steps its own copy of the environment from the same reset seeds: the training
path feeds raw observations through the training preprocessing into the training model,
the serving path through the serving preprocessing into the ONNX artifact. A ``Dict``
observation is split into the declared inputs, each key through its own preprocessing; a
recurrent policy's state outputs are fed back into its state inputs step by step on each
path (:class:`PolicyPath`). The helpers take the spec, the environment and the two engines,
never the family context. Actions are deterministic; :func:`env_action` is the one place a
policy output becomes the action the environment receives, and :func:`action_margin` says how
close that choice was.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from paritygate.errors import InputError, MissingExtra
from paritygate.imports import import_callable

if TYPE_CHECKING:
    from types import ModuleType

    from paritygate.config.policy import PolicySpec, RolloutSpec
    from paritygate.engines.base import TensorEngine
    from paritygate.families.policy.probes import Preprocessor

Observation = dict[str, np.ndarray]
"""One raw observation: an array ``(*shape,)`` per observation input."""


@dataclass
class Episode:
    """One path's episode: what it saw, what it output and did, and what it was paid."""

    seed: int
    observations: dict[str, np.ndarray]
    """Raw observations, one per step the policy acted on: (T, *shape) per observation
    input."""
    outputs: np.ndarray
    """(T, A) policy outputs."""
    actions: np.ndarray
    """(T,) discrete actions or (T, *action) continuous ones, as the environment received them."""
    margins: np.ndarray
    """(T,) the action margin of each step (:func:`action_margin`)."""
    rewards: np.ndarray
    """(T,) rewards."""
    terminated: bool = False
    truncated: bool = False
    nonfinite_step: int | None = None
    """The step whose policy output held NaN/Inf: the episode ends there, unstepped."""
    incoming_states: list[dict[str, np.ndarray]] = field(default_factory=list)
    """A recurrent policy's inputs besides the observation at each step (state, episode-start
    flag; batch of one); empty otherwise."""

    def observation(self, step: int) -> Observation:
        """The raw observation of ``step``, per observation input."""
        return {name: value[step] for name, value in self.observations.items()}

    def observation_drift(self, other: Episode, steps: int) -> float:
        """Max |difference| of the two episodes' raw observations over the first ``steps``."""
        drift = 0.0
        for name, value in self.observations.items():
            n = min(steps, len(value), len(other.observations[name]))
            if n:
                drift = max(drift, float(np.max(np.abs(
                    value[:n].astype(np.float64) - other.observations[name][:n]))))
        return drift

    @property
    def length(self) -> int:
        return len(self.rewards)

    @property
    def episode_return(self) -> float:
        return float(np.sum(self.rewards, dtype=np.float64))


class Env(Protocol):
    """What a rollout reads of a Gymnasium environment."""

    action_space: object
    observation_space: object

    def reset(self, *, seed: int | None = None) -> tuple[object, object]: ...
    def step(self, action: object) -> tuple[object, float, bool, bool, object]: ...
    def close(self) -> None: ...


def _gymnasium() -> ModuleType:
    try:
        import gymnasium
    except ImportError:
        raise MissingExtra("gymnasium", "rollout") from None
    return gymnasium


class RolloutEnv:
    """The configured environment: a fresh instance per episode, spaces checked against the
    policy once (a mismatch is bad input naming ``policy.rollout``): ``raw_shapes`` are the
    raw probes' per-row shapes per observation input, ``output_width`` runs the policy and
    gives its output's width (once the observations are found to fit)."""

    def __init__(self, spec: RolloutSpec, config_path: Path, policy: PolicySpec,
                 raw_shapes: Mapping[str, tuple[int, ...]],
                 output_width: Callable[[], int]) -> None:
        self.spec = spec
        self.key = "policy.rollout.env" if spec.env is not None else "policy.rollout.factory"
        self._config_path = config_path
        gym = _gymnasium()
        if spec.factory is not None:
            self._make = import_callable(spec.factory, config_path, self.key)
        else:
            self._make = lambda **kw: gym.make(spec.env, **kw)
        probe = self.make()
        try:
            self.action_space: Any = probe.action_space
            self.observation_space: Any = probe.observation_space
        finally:
            probe.close()
        self.discrete = isinstance(self.action_space, gym.spaces.Discrete)
        self._check_observations(gym, raw_shapes)
        self._check_actions(gym, policy.action_space, output_width())

    @property
    def name(self) -> str:
        return self.spec.env or self.spec.factory or ""

    def make(self) -> Env:
        """A new environment instance; one that cannot be built is bad input."""
        try:
            env = self._make(**self.spec.env_kwargs)
        except Exception as exc:
            raise InputError(self._config_path, self.key,
                             f"cannot build the environment: {type(exc).__name__}: {exc}") from None
        if not (hasattr(env, "reset") and hasattr(env, "step")):
            raise InputError(self._config_path, self.key,
                             f"the factory returned a {type(env).__name__}, not an environment")
        return env  # type: ignore[no-any-return]

    def _bad(self, why: str) -> InputError:
        return InputError(self._config_path, self.key, why)

    def _check_observations(self, gym: ModuleType,
                            raw_shapes: Mapping[str, tuple[int, ...]]) -> None:
        space = self.observation_space
        names = list(raw_shapes)
        if isinstance(space, gym.spaces.Dict):
            keys = list(space.spaces)
            absent = [n for n in names if n not in keys]
            if absent:
                raise self._bad(f"{self.name} observes a Dict with keys {keys}, without the "
                                f"declared observation inputs {absent} (policy.inputs)")
            shapes = {n: tuple(space.spaces[n].shape or ()) for n in names}
        elif len(names) > 1:
            raise self._bad(f"{self.name} observes a {type(space).__name__} space; policy.inputs "
                            f"declares the observation inputs {names}, which need a Dict space "
                            "with those keys")
        else:
            shapes = {names[0]: tuple(space.shape or ())}
        for name, shape in shapes.items():
            probes = tuple(raw_shapes[name])
            if shape != probes:
                what = "" if len(names) == 1 and not isinstance(space, gym.spaces.Dict) \
                    else f" key {name!r} of"
                raise self._bad(f"{self.name} observes{what} shape {list(shape)} but the probes "
                                f"(raw observations) have {list(probes)}")

    def _check_actions(self, gym: ModuleType, action_space: str, width: int) -> None:
        bad = self._bad
        if self.discrete:
            if action_space != "discrete":
                raise bad(f"{self.name} has a discrete action space; policy.action_space is "
                          f"{action_space!r}")
            if int(self.action_space.n) != width:
                raise bad(f"{self.name} has {self.action_space.n} actions; the policy outputs "
                          f"{width} logits")
        elif isinstance(self.action_space, gym.spaces.Box):
            if action_space != "continuous":
                raise bad(f"{self.name} has a continuous (Box) action space; "
                          f"policy.action_space is {action_space!r}")
            if int(np.prod(self.action_space.shape)) != width:
                raise bad(f"{self.name} takes actions of shape {list(self.action_space.shape)}; "
                          f"the policy outputs {width} values")
        else:
            raise bad(f"{self.name}'s action space {type(self.action_space).__name__} is not "
                      "Discrete or Box")


def env_action(env: RolloutEnv, spec: PolicySpec, output: np.ndarray, *,
               served: bool = False) -> int | np.ndarray:
    """The deterministic action the environment receives for one policy output row: the argmax
    of a discrete policy's logits; for a continuous policy its deterministic action
    (:func:`~paritygate.families.policy.distribution.deterministic_action`: the output as it is,
    or squashed, scaled and shifted by ``policy.distribution``; ``served`` for the artifact's
    output), clipped to the action space."""
    if env.discrete:
        return int(np.argmax(output))
    from paritygate.families.policy.distribution import deterministic_action

    space = env.action_space
    row = np.asarray(output, dtype=np.float64).reshape(1, -1)
    action = deterministic_action(spec, row, served=served).reshape(space.shape)
    clipped: np.ndarray = np.clip(action, space.low, space.high).astype(space.dtype)
    return clipped


def action_margin(env: RolloutEnv, output: np.ndarray) -> float:
    """How decided the action is: the top-1 minus top-2 logit of a discrete policy (a near-tie
    when small); ``inf`` for a continuous one, whose actions never tie."""
    row = np.asarray(output, dtype=np.float64).ravel()
    if not env.discrete or row.size < 2:
        return float("inf")
    top = np.partition(row, row.size - 2)[-2:]
    return float(top[1] - top[0])


def action_margins(discrete: bool, outputs: np.ndarray) -> np.ndarray:
    """:func:`action_margin` of every row of (T, A) outputs at once."""
    if not discrete or outputs.shape[1] < 2:
        return np.full(len(outputs), np.inf)
    top = np.sort(outputs.astype(np.float64), axis=1)[:, -2:]
    margins: np.ndarray = top[:, 1] - top[:, 0]
    return margins


def run_episode(rollout: RolloutEnv, policy: PolicyPath, seed: int) -> Episode:
    """One closed-loop episode of ``policy`` from ``reset(seed=seed)``, at most
    ``policy.rollout.max_steps`` steps; a NaN/Inf output ends it before stepping."""
    env = rollout.make()
    observations: list[Observation] = []
    incoming: list[dict[str, np.ndarray]] = []
    outputs: list[np.ndarray] = []
    actions: list[int | np.ndarray] = []
    rewards: list[float] = []
    terminated = truncated = False
    nonfinite: int | None = None
    policy.start_episode()
    try:
        obs, _ = env.reset(seed=seed)
        for step in range(rollout.spec.max_steps):
            raw = policy.observe(obs)
            observations.append(raw)
            incoming.append(policy.incoming)
            out = np.asarray(policy.act(raw), dtype=np.float32).ravel()
            outputs.append(out)
            if not math.isfinite(float(out.sum())) and not np.isfinite(out).all():
                nonfinite = step
                break
            action = env_action(rollout, policy.spec, out, served=policy.served)
            actions.append(action)
            obs, reward, terminated, truncated, _ = env.step(action)
            rewards.append(float(reward))
            if terminated or truncated:
                break
    finally:
        env.close()
    act_dtype = np.int64 if rollout.discrete else np.float32
    acted = np.asarray(outputs, np.float32).reshape(len(outputs), -1)
    stacked = {name: np.asarray([o[name] for o in observations], dtype).reshape(
        -1, *policy.shapes[name]) for name, dtype in policy.dtypes.items()}
    return Episode(
        seed=seed,
        observations=stacked,
        outputs=acted,
        actions=np.asarray(actions, act_dtype),
        margins=action_margins(rollout.discrete, acted[: len(actions)]),
        rewards=np.asarray(rewards, np.float64),
        terminated=bool(terminated),
        truncated=bool(truncated),
        nonfinite_step=nonfinite,
        incoming_states=incoming if policy.spec.recurrent is not None else [],
    )


def _as_array(x: object) -> np.ndarray:
    detach = getattr(x, "detach", None)
    if detach is not None:
        x = detach().cpu().numpy()
    return np.asarray(x, dtype=np.float32)


Preprocessors = Mapping[str, "Preprocessor"]
"""One side's preprocessing callable per observation input that has one."""


def _model_inputs(raw: Observation, preprocessors: Preprocessors) -> dict[str, np.ndarray]:
    """One raw observation as a batch of one per input, each key through its preprocessing."""
    out = {}
    for name, value in raw.items():
        x = value[None].copy()
        fn = preprocessors.get(name)
        out[name] = x if fn is None else _as_array(fn(x))
    return out


class PolicyPath:
    """One path stepping episodes: its preprocessing per observation input and its engine,
    and for a recurrent policy its state, fed back step by step. ``raw`` gives each raw
    observation input's dtype and per-row shape (the probes'); ``initial_states`` each state
    input's initial value.

    At an episode start the state is the initial state, or, when the policy declares an
    episode-start input, the state the previous episode left with the flag set to 1.0 (the
    model resets itself on it, as it does when served)."""

    def __init__(self, spec: PolicySpec, engine: TensorEngine, preprocessors: Preprocessors,
                 raw: Mapping[str, np.ndarray], initial_states: Mapping[str, np.ndarray],
                 *, served: bool) -> None:
        self.spec = spec
        self.engine = engine
        self.preprocessors = preprocessors
        self.served = served
        self.recurrent = spec.recurrent
        self.output_name = spec.output_names[0]
        self.dtypes = {name: value.dtype for name, value in raw.items()}
        self.shapes = {name: tuple(value.shape[1:]) for name, value in raw.items()}
        self.initial_states = initial_states
        self.first = spec.observation_inputs[0].name
        self.state: dict[str, np.ndarray] = {}
        self.incoming: dict[str, np.ndarray] = {}
        """The recurrent inputs of the step about to be taken (state, episode-start flag)."""

    def start_episode(self) -> None:
        rec = self.recurrent
        if rec is None:
            return
        carried = rec.episode_start is not None and self.state and all(
            np.isfinite(v).all() for v in self.state.values())
        state = dict(self.state) if carried else {
            name: value[None].copy() for name, value in self.initial_states.items()}
        if rec.episode_start is not None:
            state[rec.episode_start] = np.ones(1, np.float32)
        self.incoming = state

    def observe(self, obs: object) -> Observation:
        """The environment's observation as one raw array per observation input: a ``Dict``
        observation split into its declared keys, anything else the first input."""
        if isinstance(obs, dict | Mapping):
            return {name: np.asarray(obs[name], dtype) for name, dtype in self.dtypes.items()}
        return {self.first: np.asarray(obs, self.dtypes[self.first])}

    def act(self, raw: Observation) -> np.ndarray:
        """The policy output row for one raw observation (the state moves on one step)."""
        out = self.engine.infer({**_model_inputs(raw, self.preprocessors), **self.incoming})
        rec = self.recurrent
        if rec is not None:
            self.state = {s.input: np.asarray(out[s.output], np.float32)
                          for s in rec.states}
            self.incoming = dict(self.state)
            if rec.episode_start is not None:
                self.incoming[rec.episode_start] = np.zeros(1, np.float32)
        return np.asarray(out[self.output_name][0])


@dataclass
class Rollouts:
    """Every configured episode, stepped by the reference (training) path and by the
    candidate (serving) path."""

    env: str
    seeds: list[int]
    reference: list[Episode]
    candidate: list[Episode]
    discrete: bool


def run_rollouts(env: RolloutEnv, reference: PolicyPath, candidate: PolicyPath) -> Rollouts:
    """The ``policy.rollout`` episodes of both paths, each from the same reset seeds."""
    seeds = env.spec.episode_seeds
    return Rollouts(
        env=env.name,
        seeds=seeds,
        reference=[run_episode(env, reference, s) for s in seeds],
        candidate=[run_episode(env, candidate, s) for s in seeds],
        discrete=env.discrete,
    )


@dataclass(frozen=True)
class StepDiagnosis:
    """Where the two paths part at one raw observation."""

    input_max_abs_diff: float
    """Max |serving model input - training model input| of the worst observation input."""
    worst_input: str
    output_max_abs_diff: float
    """Max |artifact output - training output| on the same (training) model input."""


def step_diagnosis(reference: PolicyPath, candidate: PolicyPath, raw: Observation,
                   incoming: Mapping[str, np.ndarray] | None = None) -> StepDiagnosis:
    """At one raw observation both paths saw: how far the serving preprocessing's model input
    is from the training one's (worst input named), and how far the artifact's output is from
    the training model's on the same (training) model input and, for a recurrent policy, the
    training path's incoming state (``incoming``)."""
    t_in = _model_inputs(raw, reference.preprocessors)
    s_in = _model_inputs(raw, candidate.preprocessors)
    per_input = {name: (float(np.max(np.abs(t_in[name].astype(np.float64) - s_in[name])))
                        if t_in[name].shape == s_in[name].shape else float("inf"))
                 for name in t_in}
    worst = max(per_input, key=lambda n: per_input[n])
    feeds = {**t_in, **(incoming or {})}
    name = reference.output_name
    ref = reference.engine.infer(feeds)[name]
    cand = np.asarray(candidate.engine.infer(feeds)[name])
    return StepDiagnosis(input_max_abs_diff=per_input[worst], worst_input=worst,
                         output_max_abs_diff=float(np.max(np.abs(ref.astype(np.float64)
                                                                 - cand))))
