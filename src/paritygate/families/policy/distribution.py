"""A continuous policy's Gaussian: both sides' parameters, the env action, behaviour log-probs.

The policy output is the mean of a diagonal Gaussian over the pre-squash action ``u``; its
log-std is a checkpoint tensor or a second output (``policy.distribution``). The env action is
``squash(u)`` with the declared scale and bias. Everything here computes in float64 from the
sides' outputs, so the metrics add no rounding of their own. numpy only, except where a
function reads a :class:`~paritygate.families.policy.context.PolicyContext`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from paritygate.families.policy.config import DistributionSpec

if TYPE_CHECKING:
    from paritygate.families.policy.config import PolicySpec
    from paritygate.families.policy.context import PolicyContext

_LOG_2PI = float(np.log(2 * np.pi))
_EDGE = 1 - 1e-9
"""A squashed action this close to the box edge is not inverted (atanh would amplify rounding)."""


@dataclass(frozen=True)
class Gaussian:
    """One side's diagonal Gaussian on the probes (log_std after the declared clamp)."""

    mean: np.ndarray  # (N, A)
    log_std: np.ndarray  # (N, A)
    raw_log_std: np.ndarray  # (N, A) before the declared clamp

    @property
    def std(self) -> np.ndarray:
        return np.exp(self.log_std)


def _per_dim(value: float | list[float], dims: int) -> np.ndarray:
    arr = np.asarray(value, dtype=np.float64).reshape(-1)
    return np.broadcast_to(arr, (dims,)) if arr.size in (1, dims) else arr


def scale_bias(dist: DistributionSpec, dims: int) -> tuple[np.ndarray, np.ndarray]:
    """The action scale and bias, one value per action dimension, (A,) each."""
    return _per_dim(dist.action_scale, dims), _per_dim(dist.action_bias, dims)


def squash(dist: DistributionSpec, u: np.ndarray) -> np.ndarray:
    """The env action of pre-squash actions ``u`` (..., A)."""
    u = np.asarray(u, dtype=np.float64)
    scale, bias = scale_bias(dist, u.shape[-1])
    if dist.squash == "tanh":
        return bias + scale * np.tanh(u)
    if dist.squash == "clip":
        return np.clip(u, bias - np.abs(scale), bias + np.abs(scale))
    return bias + scale * u


def deterministic_action(spec: PolicySpec, output: np.ndarray, *, served: bool = False
                         ) -> np.ndarray:
    """A continuous policy's deterministic env action (N, A) from its policy output.

    ``output`` is the training side's policy output (the Gaussian's mean), or with
    ``served=True`` the artifact's first output, which already is the action when
    ``distribution.serving_output`` is ``action``. Without a ``distribution`` section the
    output is the action as it is."""
    dist = spec.distribution
    out = np.asarray(output, dtype=np.float64)
    if dist is None or (served and dist.serving_output == "action"):
        return out
    return squash(dist, out)


def clamp_log_std(dist: DistributionSpec, log_std: np.ndarray) -> np.ndarray:
    arr = np.asarray(log_std, dtype=np.float64)
    if dist.log_std_clamp is None:
        return arr
    return np.clip(arr, dist.log_std_clamp[0], dist.log_std_clamp[1])


def gaussian(dist: DistributionSpec, mean: np.ndarray, log_std: np.ndarray) -> Gaussian:
    mean64 = np.asarray(mean, dtype=np.float64)
    raw = np.broadcast_to(np.asarray(log_std, dtype=np.float64), mean64.shape)
    return Gaussian(mean64, clamp_log_std(dist, raw), raw)


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


def _log_det_elems(dist: DistributionSpec, u: np.ndarray) -> np.ndarray:
    """log |d action / d u| per dimension, from the pre-squash sample (stable tanh form)."""
    scale, _ = scale_bias(dist, u.shape[-1])
    if dist.squash == "tanh":
        # log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u))
        return np.log(np.abs(scale)) + 2 * (np.log(2.0) - u - np.logaddexp(0.0, -2 * u))
    if dist.squash == "none":
        return np.broadcast_to(np.log(np.abs(scale)), u.shape)
    return np.zeros(u.shape)  # clip: the unclipped sample's log-prob is what is logged


def _invert(dist: DistributionSpec, action: np.ndarray, u: np.ndarray
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


def action_log_prob(dist: DistributionSpec, g: Gaussian, u: np.ndarray) -> np.ndarray:
    """Log-prob of the env actions ``squash(u)`` (N, K, A) under ``g``, change of variables
    included (the tanh correction), (N, K)."""
    return np.asarray(_gauss_logp(g, u) - _log_det_elems(dist, u).sum(-1))


def behaviour_logprob_delta(dist: DistributionSpec, actor: Gaussian, learner: Gaussian,
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


# --- the two sides of a gate ---------------------------------------------------------------------


def _training_output(ctx: PolicyContext, select: str | int) -> np.ndarray:
    from paritygate.engines.torch_engine import TorchEngine

    engine = TorchEngine(ctx.training_model, input_name=ctx.input_name, output_name="out",
                         select=select)
    return engine.infer({ctx.input_name: ctx.probes})["out"]


def reference_gaussian(ctx: PolicyContext, dist: DistributionSpec) -> Gaussian:
    """The training model's Gaussian on the probes (mean: the raw policy output)."""
    mean = _training_output(ctx, ctx.spec.policy_output)
    return gaussian(dist, mean, _log_std(ctx, dist, training=True))


def _log_std(ctx: PolicyContext, dist: DistributionSpec, *, training: bool) -> Any:
    if dist.log_std == "parameter":
        return ctx.state[str(dist.log_std_key)].detach().double().numpy()
    if training:
        return _training_output(ctx, dist.log_std_key)
    names = ctx.spec.output_names
    return ctx.candidate_outputs.get(names[1]) if len(names) > 1 else None


def candidate_log_std(ctx: PolicyContext, dist: DistributionSpec) -> np.ndarray | None:
    """The artifact's log-std: the checkpoint tensor (``parameter``), its second output
    (``output``), or ``None`` when it serves none."""
    value = _log_std(ctx, dist, training=False)
    return None if value is None else np.asarray(value, dtype=np.float64)


def check_distribution(ctx: PolicyContext) -> None:
    """Bad input, up front: a ``parameter`` log-std the checkpoint lacks, or an ``output``
    the training forward does not return (exit 2 naming ``policy.distribution.log_std_key``)."""
    from paritygate.errors import InputError

    dist = ctx.spec.distribution
    if dist is None:
        return
    key = "policy.distribution.log_std_key"
    if dist.log_std == "parameter":
        if str(dist.log_std_key) not in ctx.state:
            raise InputError(ctx.config.path, key, f"{dist.log_std_key!r} is not a tensor of the "
                             f"checkpoint (a log_std parameter has a name such as "
                             f"{[k for k in ctx.state if 'std' in k.lower()][:3] or 'log_std'})")
        return
    import torch

    from paritygate.engines.torch_engine import select_output

    with torch.random.fork_rng(devices=[]), torch.inference_mode():
        try:
            output = ctx.training_model(torch.from_numpy(ctx.probes[:2]))
        except Exception:  # a forward that fails is the checks' to report
            return
        try:
            picked = select_output(output, dist.log_std_key)
        except (KeyError, IndexError, TypeError, AttributeError):
            picked = None
    if not isinstance(picked, torch.Tensor) or isinstance(output, torch.Tensor):
        raise InputError(ctx.config.path, key, f"{dist.log_std_key!r} does not pick log_std out "
                         "of the training forward's result")
