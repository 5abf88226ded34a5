"""A recurrent policy's state inputs: their initial values and the rows fed at a step."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from paritygate.errors import InputError

if TYPE_CHECKING:
    from paritygate.config import GateConfig
    from paritygate.config.policy import PolicySpec


def initial_states(config: GateConfig, spec: PolicySpec) -> dict[str, np.ndarray]:
    """Each state input's initial value (per-row shape), from a constant or a ``.npy`` file."""
    out: dict[str, np.ndarray] = {}
    if spec.recurrent is None:
        return out
    for i, state in enumerate(spec.recurrent.states):
        key = f"policy.recurrent.states[{i}].initial"
        if isinstance(state.initial, Path):
            from paritygate.reading import load_arrays

            path = state.initial
            loaded = load_arrays(path, key, what="initial state")
            if isinstance(loaded, dict):
                raise InputError(path, key, "an initial state is one .npy array, not an .npz")
            value = np.asarray(loaded).astype(np.float32)
            if list(value.shape) != list(state.shape):
                raise InputError(path, key, f"initial state of shape {list(value.shape)}, "
                                 f"the state is declared {list(state.shape)}")
        else:
            value = np.full(state.shape, state.initial, np.float32)
        out[state.input] = value
    return out


def step_state(spec: PolicySpec, initial: Mapping[str, np.ndarray], rows: int, *,
               start: bool) -> dict[str, np.ndarray]:
    """Recurrent inputs of ``rows`` rows from the ``initial`` states: the states repeated and,
    when declared, the episode-start flag (``start``: 1.0 at an episode start, 0.0 one step
    after it)."""
    if spec.recurrent is None:
        return {}
    out = {name: np.repeat(value[None], rows, axis=0) for name, value in initial.items()}
    if spec.recurrent.episode_start:
        out[spec.recurrent.episode_start] = np.full(rows, float(start), np.float32)
    return out
