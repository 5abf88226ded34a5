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
        file, key = _probe_source(config, spec)
        raise InputError(
            file, key,
            f"probes must be a non-empty numeric (N, ...) array, got {arr.dtype} {arr.shape}",
        )
    # Integer and boolean observations (discrete states, token ids) keep their dtype.
    return arr.astype(np.float32) if np.issubdtype(arr.dtype, np.floating) else arr


def _probe_source(config: GateConfig, spec: PolicySpec) -> tuple[Any, str]:
    """The file and key the probes came from (a probe file, else the generator's config)."""
    if spec.probes.file is not None:
        return config.resolve(spec.probes.file), "policy.probes.file"
    return config.path, "policy.probes.generator"


def finite_rows(config: GateConfig, spec: PolicySpec, raw: np.ndarray) -> tuple[np.ndarray, int]:
    """The raw rows without NaN/Inf (the model checks' inputs) and how many were left out.

    Non-finite observations are preprocessing's edge cases, not model inputs; a probe set
    with no finite row leaves the model checks nothing to verify, which is bad input.
    """
    keep = np.all(np.isfinite(raw.reshape(len(raw), -1)), axis=1)
    if not keep.any():
        file, key = _probe_source(config, spec)
        raise InputError(
            file,
            key,
            f"all {len(raw)} probe rows hold NaN/Inf: no row is left for the model checks",
        )
    return raw[keep], int((~keep).sum())


def preprocess(config: GateConfig, spec: PolicySpec, fn: Any, raw: np.ndarray) -> np.ndarray:
    """The training preprocessing applied to the probes; a failure names its likely source.

    An error reading the stats file (missing, a folder, not JSON/UTF-8) names the stats; any
    other failure on probes from a file names the probe file (its shape does not fit), else
    the preprocessing function.
    """
    pre = spec.preprocessing
    assert pre is not None
    try:
        return np.asarray(fn(raw), dtype=np.float32)
    except Exception as exc:
        why = f"{type(exc).__name__}: {exc}"
        if pre.stats is not None and (
            isinstance(exc, (OSError, UnicodeDecodeError)) or "JSONDecodeError" in why
        ):
            raise InputError(
                config.resolve(pre.stats),
                "policy.preprocessing.stats",
                f"training preprocessing cannot read the stats: {why}",
            ) from None
        if spec.probes.file is not None:
            raise InputError(
                config.resolve(spec.probes.file),
                "policy.probes.file",
                f"training preprocessing ({pre.training}) fails on these probes of shape "
                f"{raw.shape}: {why}",
            ) from None
        raise InputError(
            config.path,
            "policy.preprocessing.training",
            f"training preprocessing failed on the probes: {why}",
        ) from None


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
