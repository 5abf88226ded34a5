"""Probe observations and the two preprocessing implementations applied to them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from paritygate.errors import InputError
from paritygate.imports import import_callable
from paritygate.reading import check_input, load_arrays

if TYPE_CHECKING:
    from paritygate.config import GateConfig
    from paritygate.config.policy import PolicySpec


def load_probes(config: GateConfig, spec: PolicySpec) -> dict[str, np.ndarray]:
    """The raw probe observations, one (N, ...) array per observation input."""
    probes = spec.probes
    names = [i.name for i in spec.observation_inputs]
    if probes.file is not None:
        found: Any = load_arrays(probes.file, "policy.probes.file",
                                 what="probe file")
    else:
        gen = import_callable(probes.generator or "", config.path, "policy.probes.generator")
        try:
            found = gen(probes.count, probes.seed)
        except Exception as exc:
            raise InputError(
                config.path, "policy.probes.generator", f"generator failed: {exc}"
            ) from None
    arrays = _per_input(config, spec, found, names)
    rows = {k: len(v) for k, v in arrays.items()}
    if len(set(rows.values())) > 1:
        file, key = _probe_source(config, spec)
        raise InputError(file, key, f"probe arrays hold different numbers of rows: {rows}")
    for spec_in in spec.observation_inputs:
        got = list(arrays[spec_in.name].shape[1:])
        if spec_in.shape is not None and got != list(spec_in.shape):
            file, key = _probe_source(config, spec)
            raise InputError(
                file, key, f"probes of input {spec_in.name!r} have rows of shape {got}, "
                f"policy.inputs declares {list(spec_in.shape)}")
    return arrays


def _per_input(
    config: GateConfig, spec: PolicySpec, found: Any, names: list[str]
) -> dict[str, np.ndarray]:
    """Split what the probe source gave into one validated array per input name."""
    file, key = _probe_source(config, spec)
    if isinstance(found, Mapping):
        keys = list(found)
        if len(names) == 1 and len(keys) == 1:
            picked = {names[0]: found[keys[0]]}  # one array: whatever its name
        else:
            absent = [n for n in names if n not in found]
            if absent and len(names) == 1:
                raise InputError(
                    file, key,
                    f"the probes hold {len(keys)} arrays {keys} but the gate feeds one tensor "
                    f"`{names[0]}`; declare the inputs in policy.inputs")
            if absent:
                raise InputError(file, key, f"the probes have no array for inputs {absent} "
                                 f"(they hold {keys}; policy.inputs names {names})")
            picked = {n: found[n] for n in names}
    elif len(names) > 1:
        raise InputError(
            file, key, f"policy.inputs declares {len(names)} observation inputs {names}: the "
            "probes must be a mapping (a generator returning a dict, or an .npz) with one "
            f"array per input, got {type(found).__name__}")
    else:
        picked = {names[0]: found}
    out = {}
    for name, value in picked.items():
        arr = np.asarray(value)
        if arr.ndim < 2 or arr.shape[0] == 0 or not np.issubdtype(arr.dtype, np.number):
            label = "probes" if len(names) == 1 else f"probes of input {name!r}"
            raise InputError(
                file, key,
                f"{label} must be a non-empty numeric (N, ...) array, got {arr.dtype} "
                f"{arr.shape}",
            )
        # Integer and boolean observations (discrete states, token ids) keep their dtype.
        out[name] = arr.astype(np.float32) if np.issubdtype(arr.dtype, np.floating) else arr
    return out


def _probe_source(config: GateConfig, spec: PolicySpec) -> tuple[Any, str]:
    """The file and key the probes came from (a probe file, else the generator's config)."""
    if spec.probes.file is not None:
        return spec.probes.file, "policy.probes.file"
    return config.path, "policy.probes.generator"


def finite_rows(
    config: GateConfig, spec: PolicySpec, raw: Mapping[str, np.ndarray]
) -> tuple[dict[str, np.ndarray], int]:
    """The raw rows without NaN/Inf in any input (the model checks' inputs) and how many were
    left out.

    Non-finite observations are preprocessing's edge cases, not model inputs; a probe set
    with no finite row leaves the model checks nothing to verify, which is bad input.
    """
    n = len(next(iter(raw.values())))
    keep = np.ones(n, bool)
    for arr in raw.values():
        keep &= np.all(np.isfinite(arr.reshape(len(arr), -1)), axis=1)
    if not keep.any():
        file, key = _probe_source(config, spec)
        raise InputError(
            file,
            key,
            f"all {n} probe rows hold NaN/Inf: no row is left for the model checks",
        )
    return {k: v[keep] for k, v in raw.items()}, int((~keep).sum())


def preprocess(
    config: GateConfig, spec: PolicySpec, fn: Preprocessor, raw: np.ndarray,
    name: str | None = None
) -> np.ndarray:
    """The training preprocessing applied to the probes; a failure names its likely source.

    An error reading the stats file (missing, a folder, not JSON/UTF-8) names the stats; any
    other failure on probes from a file names the probe file (its shape does not fit), else
    the preprocessing function.
    """
    name = name or spec.observation_inputs[0].name
    pre = spec.input_preprocessing(name)
    section = spec.preprocessing_key(name)
    assert pre is not None
    label = f" of input {name!r}" if len(spec.observation_inputs) > 1 else ""
    try:
        return np.asarray(fn(raw), dtype=np.float32)
    except Exception as exc:
        why = f"{type(exc).__name__}: {exc}"
        if pre.stats is not None and (
            isinstance(exc, (OSError, UnicodeDecodeError)) or "JSONDecodeError" in why
        ):
            raise InputError(
                pre.stats,
                f"{section}.stats",
                f"training preprocessing cannot read the stats: {why}",
            ) from None
        if spec.probes.file is not None:
            raise InputError(
                spec.probes.file,
                "policy.probes.file",
                f"training preprocessing ({pre.training}) fails on these probes"
                f"{label} of shape {raw.shape}: {why}",
            ) from None
        raise InputError(
            config.path,
            f"{section}.training",
            f"training preprocessing failed on the probes{label}: {why}",
        ) from None


Preprocessor = Callable[[np.ndarray], object]
"""A preprocessing callable bound to its kwargs: raw observations (N, ...) -> model input."""


def input_preprocessors(config: GateConfig, spec: PolicySpec
                        ) -> dict[str, tuple[Preprocessor, Preprocessor]]:
    """``{input name: (training, serving)}`` for each observation input with preprocessing."""
    out = {}
    for spec_in in spec.observation_inputs:
        pre = spec.input_preprocessing(spec_in.name)
        if pre is None:
            continue
        section = spec.preprocessing_key(spec_in.name)
        kwargs = dict(pre.kwargs)
        if pre.stats is not None:
            stats = check_input(pre.stats, f"{section}.stats",
                                what="preprocessing stats file")
            kwargs["stats_path"] = stats
        training = import_callable(pre.training, config.path, f"{section}.training")
        serving = import_callable(pre.serving, config.path, f"{section}.serving")
        out[spec_in.name] = (_bind(training, kwargs), _bind(serving, kwargs))
    return out


Preprocessors = dict[str, tuple[Preprocessor, Preprocessor]]
"""``{observation input: (training, serving)}`` preprocessing callables."""


def reference_inputs(config: GateConfig, spec: PolicySpec, preprocessors: Preprocessors,
                     raw: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Raw observations (per observation input) through the training preprocessing."""
    out = {}
    for name, values in raw.items():
        fn = preprocessors.get(name)
        out[name] = values if fn is None else preprocess(config, spec, fn[0], values, name)
    return out


def probes_digest(raw_inputs: Mapping[str, np.ndarray]) -> str:
    """sha256 of the raw probe arrays (values, shape and dtype; names when several)."""
    import hashlib

    h = hashlib.sha256()
    for i, (name, value) in enumerate(raw_inputs.items()):
        raw = np.ascontiguousarray(value)
        if i or len(raw_inputs) > 1:
            h.update(name.encode())
        h.update(f"{raw.dtype}{raw.shape}".encode())
        h.update(raw.tobytes())
    return h.hexdigest()


def _bind(fn: Callable[..., object], kwargs: dict[str, object]) -> Preprocessor:
    return lambda raw: fn(raw, **kwargs)
