"""The hf_model family builds no serving artifact: it gates the model directory as it is."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from paritygate.errors import InputError

if TYPE_CHECKING:
    from paritygate.config import GateConfig


def export_unsupported(config: GateConfig, out_dir: Path) -> Path:
    """Always raises: this family measures a model directory, it exports nothing."""
    raise InputError(
        config.path,
        "family",
        "export is not supported for family hf_model (it gates precision and weights of the "
        "model directory as it is; export a serving artifact with your own exporter)",
    )
