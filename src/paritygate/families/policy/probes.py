"""Probe observations and the two preprocessing implementations applied to them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from paritygate.errors import InputError
from paritygate.imports import import_callable

if TYPE_CHECKING:
    from paritygate.config import GateConfig
    from paritygate.families.policy.config import PolicySpec


def load_probes(config: GateConfig, spec: PolicySpec) -> np.ndarray:
    probes = spec.probes
    if probes.file is not None:
        path = config.resolve(probes.file)
        if not path.exists():
            raise InputError(path, "policy.probes.file", "probe file not found")
        try:
            loaded = np.load(path, allow_pickle=False)
            arr = loaded[loaded.files[0]] if hasattr(loaded, "files") else loaded
        except Exception as exc:
            raise InputError(path, "policy.probes.file", f"unreadable probes: {exc}") from None
    else:
        gen = import_callable(probes.generator or "", config.path, "policy.probes.generator")
        try:
            arr = gen(probes.count, probes.seed)
        except Exception as exc:
            raise InputError(
                config.path, "policy.probes.generator", f"generator failed: {exc}"
            ) from None
    arr = np.asarray(arr)
    if arr.ndim < 2 or arr.shape[0] == 0 or not np.issubdtype(arr.dtype, np.number):
        raise InputError(
            config.path,
            "policy.probes",
            f"probes must be a non-empty numeric (N, ...) array, got {arr.dtype} {arr.shape}",
        )
    # Integer and boolean observations (discrete states, token ids) keep their dtype.
    return arr.astype(np.float32) if np.issubdtype(arr.dtype, np.floating) else arr


def preprocessors(config: GateConfig, spec: PolicySpec) -> tuple[Any, Any]:
    pre = spec.preprocessing
    if pre is None:
        return None, None
    kwargs = dict(pre.kwargs)
    if pre.stats is not None:
        stats = config.resolve(pre.stats)
        if not stats.exists():
            raise InputError(
                stats, "policy.preprocessing.stats", "preprocessing stats file not found"
            )
        kwargs["stats_path"] = stats
    training = import_callable(pre.training, config.path, "policy.preprocessing.training")
    serving = import_callable(pre.serving, config.path, "policy.preprocessing.serving")

    def bind(fn: Any) -> Any:
        return lambda raw: fn(raw, **kwargs)

    return bind(training), bind(serving)
