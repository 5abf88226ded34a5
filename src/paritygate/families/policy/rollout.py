"""Closed-loop episodes of a policy in a Gymnasium environment (``policy.rollout``).

Each path steps its own copy of the environment from the same reset seeds: the training
path feeds raw observations through the training preprocessing into the training model,
the serving path through the serving preprocessing into the ONNX artifact. Actions are
deterministic; :func:`env_action` is the one place a policy output becomes the action the
environment receives, and :func:`action_margin` says how close that choice was.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from paritygate.errors import InputError, MissingExtra
from paritygate.imports import import_callable

if TYPE_CHECKING:
    from paritygate.families.policy.config import RolloutSpec
    from paritygate.families.policy.context import PolicyContext

Policy = Callable[[np.ndarray], np.ndarray]
"""One path: a raw observation ``(*obs,)`` in, the policy output row ``(A,)`` out."""


@dataclass
class Episode:
    """One path's episode: what it saw, what it output and did, and what it was paid."""

    seed: int
    observations: np.ndarray
    """(T, *obs) raw observations, one per step the policy acted on."""
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

    @property
    def length(self) -> int:
        return len(self.rewards)

    @property
    def episode_return(self) -> float:
        return float(np.sum(self.rewards, dtype=np.float64))


def _gymnasium() -> Any:
    try:
        import gymnasium
    except ImportError:
        raise MissingExtra("gymnasium", "rollout") from None
    return gymnasium


class RolloutEnv:
    """The configured environment: a fresh instance per episode, spaces checked against the
    policy once (a mismatch is bad input naming ``policy.rollout``)."""

    def __init__(self, ctx: PolicyContext, spec: RolloutSpec) -> None:
        self.spec = spec
        self.key = "policy.rollout.env" if spec.env is not None else "policy.rollout.factory"
        self._config_path = ctx.config.path
        gym = _gymnasium()
        if spec.factory is not None:
            self._make = import_callable(spec.factory, ctx.config.path, self.key)
        else:
            self._make = lambda **kw: gym.make(spec.env, **kw)
        probe = self.make()
        try:
            self.action_space = probe.action_space
            self.observation_space = probe.observation_space
        finally:
            probe.close()
        self.discrete = isinstance(self.action_space, gym.spaces.Discrete)
        self._check_spaces(ctx, gym)

    @property
    def name(self) -> str:
        return self.spec.env or self.spec.factory or ""

    def make(self) -> Any:
        """A new environment instance; one that cannot be built is bad input."""
        try:
            env = self._make(**self.spec.env_kwargs)
        except Exception as exc:
            raise InputError(self._config_path, self.key,
                             f"cannot build the environment: {type(exc).__name__}: {exc}") from None
        if not (hasattr(env, "reset") and hasattr(env, "step")):
            raise InputError(self._config_path, self.key,
                             f"the factory returned a {type(env).__name__}, not an environment")
        return env

    def _check_spaces(self, ctx: PolicyContext, gym: Any) -> None:
        def bad(why: str) -> InputError:
            return InputError(self._config_path, self.key, why)

        obs_shape = tuple(self.observation_space.shape or ())
        if obs_shape != tuple(ctx.raw_probes.shape[1:]):
            raise bad(f"{self.name} observes shape {list(obs_shape)} but the probes (raw "
                      f"observations) have {list(ctx.raw_probes.shape[1:])}")
        width = int(np.prod(ctx.reference_outputs.shape[1:]))
        if self.discrete:
            if ctx.spec.action_space != "discrete":
                raise bad(f"{self.name} has a discrete action space; policy.action_space is "
                          f"{ctx.spec.action_space!r}")
            if int(self.action_space.n) != width:
                raise bad(f"{self.name} has {self.action_space.n} actions; the policy outputs "
                          f"{width} logits")
        elif isinstance(self.action_space, gym.spaces.Box):
            if ctx.spec.action_space != "continuous":
                raise bad(f"{self.name} has a continuous (Box) action space; "
                          f"policy.action_space is {ctx.spec.action_space!r}")
            if int(np.prod(self.action_space.shape)) != width:
                raise bad(f"{self.name} takes actions of shape {list(self.action_space.shape)}; "
                          f"the policy outputs {width} values")
        else:
            raise bad(f"{self.name}'s action space {type(self.action_space).__name__} is not "
                      "Discrete or Box")


def env_action(ctx: PolicyContext, output: np.ndarray, *, served: bool = False) -> Any:
    """The deterministic action the environment receives for one policy output row: the argmax
    of a discrete policy's logits; for a continuous policy its deterministic action
    (:func:`~paritygate.families.policy.distribution.deterministic_action`: the output as it is,
    or squashed, scaled and shifted by ``policy.distribution``; ``served`` for the artifact's
    output), clipped to the action space."""
    env = ctx.rollout_env
    assert env is not None
    if env.discrete:
        return int(np.argmax(output))
    from paritygate.families.policy.distribution import deterministic_action

    space = env.action_space
    row = np.asarray(output, dtype=np.float64).reshape(1, -1)
    action = deterministic_action(ctx.spec, row, served=served).reshape(space.shape)
    return np.clip(action, space.low, space.high).astype(space.dtype)


def action_margin(ctx: PolicyContext, output: np.ndarray) -> float:
    """How decided the action is: the top-1 minus top-2 logit of a discrete policy (a near-tie
    when small); ``inf`` for a continuous one, whose actions never tie."""
    env = ctx.rollout_env
    assert env is not None
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


def run_episode(ctx: PolicyContext, policy: Policy, seed: int, *, served: bool = False
                ) -> Episode:
    """One closed-loop episode of ``policy`` from ``reset(seed=seed)``, at most
    ``policy.rollout.max_steps`` steps; a NaN/Inf output ends it before stepping. ``served``:
    ``policy`` is the serving path (its output read as the artifact's, see :func:`env_action`)."""
    rollout = ctx.rollout_env
    assert rollout is not None
    env = rollout.make()
    observations: list[np.ndarray] = []
    outputs: list[np.ndarray] = []
    actions: list[Any] = []
    rewards: list[float] = []
    terminated = truncated = False
    nonfinite: int | None = None
    try:
        obs, _ = env.reset(seed=seed)
        for step in range(rollout.spec.max_steps):
            raw = np.asarray(obs, dtype=np.float32)
            out = np.asarray(policy(raw), dtype=np.float32).ravel()
            observations.append(raw)
            outputs.append(out)
            if not math.isfinite(float(out.sum())) and not np.isfinite(out).all():
                nonfinite = step
                break
            action = env_action(ctx, out, served=served)
            actions.append(action)
            obs, reward, terminated, truncated, _ = env.step(action)
            rewards.append(float(reward))
            if terminated or truncated:
                break
    finally:
        env.close()
    shape = tuple(rollout.observation_space.shape or ())
    act_dtype = np.int64 if rollout.discrete else np.float32
    acted = np.asarray(outputs, np.float32).reshape(len(outputs), -1)
    return Episode(
        seed=seed,
        observations=np.asarray(observations, np.float32).reshape(-1, *shape),
        outputs=acted,
        actions=np.asarray(actions, act_dtype),
        margins=action_margins(rollout.discrete, acted[: len(actions)]),
        rewards=np.asarray(rewards, np.float64),
        terminated=bool(terminated),
        truncated=bool(truncated),
        nonfinite_step=nonfinite,
    )


def _as_array(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=np.float32)


def training_path(ctx: PolicyContext) -> Policy:
    """Training preprocessing, then the training model's policy output (torch, eval)."""
    pre = ctx.training_preprocess
    engine, name, out = ctx.reference, ctx.input_name, ctx.output_name

    def act(raw: np.ndarray) -> np.ndarray:
        x = raw[None].copy()
        x = x if pre is None else _as_array(pre(x))
        return engine.infer({name: x})[out][0]  # type: ignore[no-any-return]

    return act


def serving_path(ctx: PolicyContext) -> Policy:
    """Serving preprocessing, then the candidate artifact (ONNX Runtime)."""
    pre = ctx.serving_preprocess
    engine, name, out = ctx.candidate, ctx.input_name, ctx.output_name

    def act(raw: np.ndarray) -> np.ndarray:
        x = raw[None].copy()
        x = x if pre is None else _as_array(pre(x))
        return np.asarray(engine.infer({name: x})[out][0])

    return act


@dataclass
class Rollouts:
    """Every configured episode, stepped by the training path and by the serving path."""

    env: str
    seeds: list[int]
    training: list[Episode]
    serving: list[Episode]
    discrete: bool


def run_rollouts(ctx: PolicyContext) -> Rollouts | None:
    """The ``policy.rollout`` episodes of both paths (``None`` without a rollout section)."""
    env = ctx.rollout_env
    if env is None:
        return None
    seeds = env.spec.episode_seeds
    train, serve = training_path(ctx), serving_path(ctx)
    return Rollouts(
        env=env.name,
        seeds=seeds,
        training=[run_episode(ctx, train, s) for s in seeds],
        serving=[run_episode(ctx, serve, s, served=True) for s in seeds],
        discrete=env.discrete,
    )


def step_diagnosis(ctx: PolicyContext, raw: np.ndarray) -> dict[str, float]:
    """At one raw observation both paths saw: how far the serving preprocessing's model input
    is from the training one's, and how far the artifact's output is from the training
    model's on the same (training) model input."""
    x = raw[None].astype(np.float32)
    t_in = x if ctx.training_preprocess is None else _as_array(ctx.training_preprocess(x.copy()))
    s_in = x if ctx.serving_preprocess is None else _as_array(ctx.serving_preprocess(x.copy()))
    ref = ctx.reference.infer({ctx.input_name: t_in})[ctx.output_name]
    cand = np.asarray(ctx.candidate.infer({ctx.input_name: t_in})[ctx.output_name])
    same = t_in.shape == s_in.shape
    return {
        "input_max_abs_diff": float(np.max(np.abs(t_in - s_in))) if same else float("inf"),
        "output_max_abs_diff": float(np.max(np.abs(ref.astype(np.float64) - cand))),
    }
