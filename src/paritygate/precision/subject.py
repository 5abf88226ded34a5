"""What a model family hands to the per-layer precision measurement."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


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
    build_model: Callable[[], Any]
    batches: list[tuple[tuple[Any, ...], dict[str, Any]]]
    select_output: Callable[[Any], Any]
    onnx_path: Path | None = None
    onnx_feeds: list[dict[str, Any]] | None = None
    onnx_output_name: str | None = None
    onnx_output_transform: Callable[[Any], Any] | None = None
    """Maps the torch model's selected output (a numpy array) to the artifact's terms before
    they are compared (a policy whose artifact serves the env action while the inference
    model returns the pre-squash output); ``None``: compared as they are."""
    extra: dict[str, Any] = field(default_factory=dict)
    streamed: bool = False
    """The model reads its layers from disk as they run (``precision.streaming``): the pass
    keeps its per-layer tensors in a temporary file too, so memory does not grow with depth."""
    refusal: str | None = None
    """Why the model must not be measured (tensors left at random init); the check fails
    with it before any measurement."""
    skip: str | None = None
    """Why the model cannot be measured layer by layer (its layers take no hooks): the check
    is skipped with it, never an error."""
