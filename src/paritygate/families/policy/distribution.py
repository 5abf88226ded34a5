"""A continuous policy's two sides: the training model's Gaussian, the artifact's log-std, and
the deterministic env action of a policy output (``policy.distribution``).

The numbers themselves are :mod:`paritygate.metrics.gaussian`; this module reads them off a
:class:`~paritygate.families.policy.context.PolicyContext`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from paritygate.metrics.gaussian import Gaussian, gaussian, squash

if TYPE_CHECKING:
    from paritygate.families.policy.config import DistributionSpec, PolicySpec
    from paritygate.families.policy.context import PolicyContext


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


# --- the two sides of a gate ---------------------------------------------------------------------


def reference_gaussian(ctx: PolicyContext, dist: DistributionSpec) -> Gaussian:
    """The training model's Gaussian on the probes (mean: the raw policy output)."""
    mean = ctx.reference_results[ctx.output_name]
    return gaussian(dist, mean, _log_std(ctx, dist, training=True))


def _log_std(ctx: PolicyContext, dist: DistributionSpec, *, training: bool) -> Any:
    if dist.log_std == "parameter":
        return ctx.state[str(dist.log_std_key)].detach().double().numpy()
    if training:
        return ctx.training_log_std
    names = ctx.spec.output_names
    return ctx.candidate_outputs.get(names[1]) if len(names) > 1 else None


def training_log_std(ctx: PolicyContext, dist: DistributionSpec) -> np.ndarray:
    """The training model's log-std on the probes (``log_std: output``), clamped to
    ``log_std_clamp`` (the training side's raw output; what the serving side serves is
    compared as served)."""
    value = np.asarray(ctx.training_log_std, np.float32)
    if dist.log_std_clamp is not None:
        low, high = dist.log_std_clamp
        value = np.clip(value, low, high).astype(np.float32)
    return value


def candidate_log_std(ctx: PolicyContext, dist: DistributionSpec) -> np.ndarray | None:
    """The artifact's log-std: the checkpoint tensor (``parameter``), its second output
    (``output``), or ``None`` when it serves none."""
    value = _log_std(ctx, dist, training=False)
    return None if value is None else np.asarray(value, dtype=np.float64)


def check_distribution(ctx: PolicyContext) -> None:
    """Bad input, up front: a ``parameter`` log-std the checkpoint lacks (exit 2 naming
    ``policy.distribution.log_std_key``; an ``output`` key is checked with the policy output,
    :func:`~paritygate.families.policy.context.check_policy_output`), or an action scale or
    bias of another width than the policy output."""
    from paritygate.errors import InputError

    dist = ctx.spec.distribution
    if dist is None:
        return
    key = "policy.distribution.log_std_key"
    if dist.gaussian and dist.log_std == "parameter" and str(dist.log_std_key) not in ctx.state:
        named = [k for k in ctx.state if "std" in k.lower()][:3]
        hint = f"its log-std tensors: {named}" if named else "none is named like a log-std"
        raise InputError(ctx.config.path, key, f"{dist.log_std_key!r} is not a tensor of the "
                         f"checkpoint ({hint})")
    try:
        dims = int(np.prod(ctx.reference_results[ctx.output_name].shape[1:]))
    except Exception:  # a forward that fails is the checks' to report
        return
    for name in ("action_scale", "action_bias"):
        value = getattr(dist, name)
        n = len(value) if isinstance(value, list) else 1
        if n not in (1, dims):
            raise InputError(ctx.config.path, f"policy.distribution.{name}", f"{n} values for "
                             f"a policy output of {dims} action dimensions (give one, or one "
                             "per dimension)")

