"""A continuous policy's two sides: the training model's Gaussian, the artifact's log-std, and
the deterministic env action of a policy output (``policy.distribution``).

The numbers themselves are :mod:`paritygate.metrics.gaussian`; this module takes the spec, the
checkpoint state and the two sides' outputs, never the family context.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from paritygate.metrics.gaussian import Gaussian, gaussian, squash

if TYPE_CHECKING:
    from pathlib import Path

    from torch import Tensor

    from paritygate.config.policy import DistributionSpec, PolicySpec


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


def parameter_log_std(state: Mapping[str, Tensor], dist: DistributionSpec) -> np.ndarray:
    """A ``log_std: parameter`` distribution's log-std: the checkpoint tensor, float64."""
    value: np.ndarray = state[str(dist.log_std_key)].detach().double().numpy()
    return value


def reference_gaussian(dist: DistributionSpec, mean: np.ndarray, raw_log_std: np.ndarray
                       ) -> Gaussian:
    """The training model's Gaussian on the probes: ``mean`` its raw policy output,
    ``raw_log_std`` the training forward's log-std (or the checkpoint parameter)."""
    return gaussian(dist, mean, raw_log_std)


def clamped_log_std(raw_log_std: np.ndarray, dist: DistributionSpec) -> np.ndarray:
    """The training model's log-std (``log_std: output``), clamped to ``log_std_clamp`` (the
    training side's raw output; what the serving side serves is compared as served)."""
    value = np.asarray(raw_log_std, np.float32)
    if dist.log_std_clamp is not None:
        low, high = dist.log_std_clamp
        value = np.clip(value, low, high).astype(np.float32)
    return value


def candidate_log_std(dist: DistributionSpec, state: Mapping[str, Tensor],
                      candidate_outputs: Callable[[], Mapping[str, np.ndarray]],
                      output_names: Sequence[str]) -> np.ndarray | None:
    """The artifact's log-std: the checkpoint tensor (``parameter``), its second output
    (``output``; ``candidate_outputs`` runs the artifact), or ``None`` when it serves none."""
    if dist.log_std == "parameter":
        return parameter_log_std(state, dist)
    value = candidate_outputs().get(output_names[1]) if len(output_names) > 1 else None
    return None if value is None else np.asarray(value, dtype=np.float64)


def check_distribution(config_path: Path, spec: PolicySpec, state: Mapping[str, Tensor],
                       reference_output: Callable[[], np.ndarray]) -> None:
    """Bad input, up front: a ``parameter`` log-std the checkpoint lacks (exit 2 naming
    ``policy.distribution.log_std_key``; an ``output`` key is checked with the policy output,
    :func:`~paritygate.families.policy.validation.check_policy_output`), or an action scale or
    bias of another width than the policy output (``reference_output`` runs the training
    forward)."""
    from paritygate.errors import InputError

    dist = spec.distribution
    if dist is None:
        return
    key = "policy.distribution.log_std_key"
    if dist.gaussian and dist.log_std == "parameter" and str(dist.log_std_key) not in state:
        named = [k for k in state if "std" in k.lower()][:3]
        hint = f"its log-std tensors: {named}" if named else "none is named like a log-std"
        raise InputError(config_path, key, f"{dist.log_std_key!r} is not a tensor of the "
                         f"checkpoint ({hint})")
    try:
        dims = int(np.prod(reference_output().shape[1:]))
    except Exception:  # a forward that fails is the checks' to report
        return
    for name in ("action_scale", "action_bias"):
        value = getattr(dist, name)
        n = len(value) if isinstance(value, list) else 1
        if n not in (1, dims):
            raise InputError(config_path, f"policy.distribution.{name}", f"{n} values for "
                             f"a policy output of {dims} action dimensions (give one, or one "
                             "per dimension)")
