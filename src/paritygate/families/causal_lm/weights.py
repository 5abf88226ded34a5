"""Checkpoint tensors of a causal-LM model directory, read without running any code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from paritygate.engines.hf_loading import safetensors_files


def read_state(directory: Path) -> dict[str, Any]:
    """Every tensor of a model directory's safetensors files (no code runs)."""
    from safetensors.torch import load_file

    state: dict[str, Any] = {}
    for path in safetensors_files(directory):
        state.update(load_file(str(path)))
    return state
