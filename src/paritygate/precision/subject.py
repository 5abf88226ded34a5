"""What a model family hands to the per-layer precision measurement."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from torch import nn


@dataclass
class PrecisionSubject:
    """A model to measure layer by layer, and the probe batches to run it on.

    ``build_model()`` returns a fresh fp32 eval-mode ``torch.nn.Module`` with the
    checkpoint's weights (the inference model, training heads removed). Each
    batch is ``(args, kwargs)`` for its forward; ``select_output`` picks the
    compared tensor out of whatever forward returns. ``onnx_path`` and
    ``onnx_feeds`` (name-keyed arrays aligned with ``batches``) are set when the
    candidate is an ONNX artifact.
    """

    name: str
    build_model: Callable[[], nn.Module]
    batches: Sequence[tuple[tuple[object, ...], Mapping[str, object]]]
    select_output: Callable[[Any], object]
    """Takes whatever the model's forward returns (an attribute of it, an item)."""
    onnx_path: Path | None = None
    onnx_feeds: list[dict[str, np.ndarray]] | None = None
    onnx_output_name: str | None = None
    onnx_output_transform: Callable[[np.ndarray], np.ndarray] | None = None
    """Maps the torch model's selected output (a numpy array) to the artifact's terms before
    they are compared (a policy whose artifact serves the env action while the inference
    model returns the pre-squash output); ``None``: compared as they are."""
    extra: dict[str, list[str]] = field(default_factory=dict)
    """``notes``: lines the family adds to the precision report's notes."""
    streamed: bool = False
    """The model reads its layers from disk as they run (``precision.streaming``): the pass
    keeps its per-layer tensors in a temporary file too, so memory does not grow with depth."""
    refusal: str | None = None
    """Why the model must not be measured (tensors left at random init); the check fails
    with it before any measurement."""
    skip: str | None = None
    """Why the model cannot be measured layer by layer (its layers take no hooks): the check
    is skipped with it, never an error."""
