"""A diagonal Gaussian policy's numbers: squashed actions, KL, log-probs with the change of
variables (numpy only, float64, deterministic).

The Gaussian is over the pre-squash action ``u``; ``squash`` turns it into the env action with
a scale and bias (:class:`ActionTransform`, which ``policy.distribution`` satisfies).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


class ActionTransform(Protocol):
    """How pre-squash actions become env actions, and how log-stds are clamped."""

    @property
    def squash(self) -> str: ...
    @property
    def action_scale(self) -> float | list[float]: ...
    @property
    def action_bias(self) -> float | list[float]: ...
    @property
    def log_std_clamp(self) -> list[float] | None: ...
    @property
    def samples(self) -> int: ...


_LOG_2PI = float(np.log(2 * np.pi))
_EDGE = 1 - 1e-9
"""A squashed action this close to the box edge is not inverted (atanh would amplify rounding)."""


@dataclass(frozen=True)
class Gaussian:
    """One side's diagonal Gaussian on the probes (the training side's log_std after the
    declared clamp; a served log_std as served)."""

    mean: np.ndarray  # (N, A)
    log_std: np.ndarray  # (N, A)
    raw_log_std: np.ndarray  # (N, A) before the declared clamp

    @property
    def std(self) -> np.ndarray:
        return np.exp(self.log_std)


def _per_dim(value: float | list[float], dims: int) -> np.ndarray:
    arr = np.asarray(value, dtype=np.float64).reshape(-1)
    return np.broadcast_to(arr, (dims,)) if arr.size in (1, dims) else arr


def scale_bias(dist: ActionTransform, dims: int) -> tuple[np.ndarray, np.ndarray]:
    """The action scale and bias, one value per action dimension, (A,) each."""
    return _per_dim(dist.action_scale, dims), _per_dim(dist.action_bias, dims)


def squash(dist: ActionTransform, u: np.ndarray) -> np.ndarray:
    """The env action of pre-squash actions ``u`` (..., A)."""
    u = np.asarray(u, dtype=np.float64)
    scale, bias = scale_bias(dist, u.shape[-1])
    if dist.squash == "tanh":
        return bias + scale * np.tanh(u)
    if dist.squash == "clip":
        return np.clip(u, bias - np.abs(scale), bias + np.abs(scale))
    return bias + scale * u


def clamp_log_std(dist: ActionTransform, log_std: np.ndarray) -> np.ndarray:
    arr = np.asarray(log_std, dtype=np.float64)
    if dist.log_std_clamp is None:
        return arr
    return np.clip(arr, dist.log_std_clamp[0], dist.log_std_clamp[1])


def gaussian(dist: ActionTransform, mean: np.ndarray, log_std: np.ndarray, *,
             clamp: bool = True) -> Gaussian:
    """A Gaussian from a mean and a raw log-std, the declared clamp applied unless
    ``clamp=False`` (a log-std as an artifact serves it, its own clamp already applied)."""
    mean64 = np.asarray(mean, dtype=np.float64)
    raw = np.broadcast_to(np.asarray(log_std, dtype=np.float64), mean64.shape)
    return Gaussian(mean64, clamp_log_std(dist, raw) if clamp else raw, raw)


def kl_per_row(reference: Gaussian, candidate: Gaussian) -> np.ndarray:
    """KL(reference || candidate) per probe, summed over action dimensions, (N,)."""
    var_r, var_c = np.exp(2 * reference.log_std), np.exp(2 * candidate.log_std)
    per_dim = (candidate.log_std - reference.log_std
               + (var_r + (reference.mean - candidate.mean) ** 2) / (2 * var_c) - 0.5)
    return np.asarray(per_dim.sum(-1))


def _gauss_logp(g: Gaussian, u: np.ndarray) -> np.ndarray:
    """log N(u; mean, std) summed over dims; ``u`` (N, K, A) -> (N, K)."""
    mean, log_std = g.mean[:, None, :], g.log_std[:, None, :]
    z = (u - mean) / np.exp(log_std)
    return np.asarray((-0.5 * z**2 - log_std - 0.5 * _LOG_2PI).sum(-1))


def _log_det_elems(dist: ActionTransform, u: np.ndarray) -> np.ndarray:
    """log |d action / d u| per dimension, from the pre-squash sample (stable tanh form)."""
    scale, _ = scale_bias(dist, u.shape[-1])
    if dist.squash == "tanh":
        # log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u))
        return np.log(np.abs(scale)) + 2 * (np.log(2.0) - u - np.logaddexp(0.0, -2 * u))
    if dist.squash == "none":
        return np.broadcast_to(np.log(np.abs(scale)), u.shape)
    return np.zeros(u.shape)  # clip: the unclipped sample's log-prob is what is logged


def _invert(dist: ActionTransform, action: np.ndarray, u: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:
    """The learner's view of a stored env action: its pre-squash action and log-det (N, K)."""
    scale, bias = scale_bias(dist, action.shape[-1])
    if dist.squash == "tanh":
        y = np.clip((action - bias) / scale, -_EDGE, _EDGE)
        inside = np.abs((action - bias) / scale) < _EDGE
        u_rec = np.where(inside, np.arctanh(y), u)
        log_det = np.where(inside, np.log(np.abs(scale)) + np.log1p(-(y**2)),
                           _log_det_elems(dist, u))
        return u_rec, np.asarray(log_det.sum(-1))
    if dist.squash == "none":
        return (action - bias) / scale, np.asarray(_log_det_elems(dist, u).sum(-1))
    return u, np.zeros(u.shape[:-1])  # clip: SB3 stores the unclipped action


def action_log_prob(dist: ActionTransform, g: Gaussian, u: np.ndarray) -> np.ndarray:
    """Log-prob of the env actions ``squash(u)`` (N, K, A) under ``g``, change of variables
    included (the tanh correction), (N, K)."""
    return np.asarray(_gauss_logp(g, u) - _log_det_elems(dist, u).sum(-1))


def behaviour_logprob_delta(dist: ActionTransform, actor: Gaussian, learner: Gaussian,
                            seed: int) -> np.ndarray:
    """learner recompute − actor's logged log-prob of actions the actor samples, (N, K).

    The actor (serving side) samples ``u`` from its Gaussian, acts ``squash(u)`` and logs
    ``log N(u; actor) − log|d action/d u|`` (the tanh correction); the learner recomputes
    the stored action's log-prob from its own Gaussian (inverting the squash), as an
    off-policy or PPO update does. Seeded: the same inputs give the same samples."""
    rng = np.random.default_rng(seed)
    n, a = actor.mean.shape
    noise = rng.standard_normal((n, dist.samples, a))
    u = actor.mean[:, None, :] + actor.std[:, None, :] * noise  # (N, K, A)
    action = squash(dist, u)
    logp_actor = action_log_prob(dist, actor, u)
    u_rec, log_det = _invert(dist, action, u)
    logp_learner = _gauss_logp(learner, u_rec) - log_det
    return np.asarray(logp_learner - logp_actor)
