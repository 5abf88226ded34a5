"""The policy's precision subject: the heads-removed torch model measured layer by layer
(:mod:`paritygate.precision`), and the ONNX artifact it is compared with."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from torch import nn

    from paritygate.config.policy import PolicySpec
    from paritygate.precision.subject import PrecisionSubject


def precision_subject(
    name: str,
    spec: PolicySpec,
    build_model: Callable[[], nn.Module],
    heads_removed_model: nn.Module,
    feeds: Mapping[str, np.ndarray],
    *,
    onnx_compare: bool,
    artifact_format: str,
    artifact_path: Callable[[], Path],
    output_transform: Callable[[np.ndarray], np.ndarray] | None,
) -> PrecisionSubject:
    """``build_model`` makes a fresh heads-removed model with the checkpoint's weights;
    ``artifact_path`` is called only when the artifact is compared (it may export one);
    ``output_transform`` maps the model's output to the artifact's terms."""
    import torch

    from paritygate.engines.torch_engine import ForwardAdapter, select_output
    from paritygate.precision.subject import PrecisionSubject

    names, call = spec.input_names, spec.call
    tensors = tuple(torch.from_numpy(np.ascontiguousarray(feeds[n])) for n in names)
    compare = onnx_compare
    notes: list[str] = []
    if compare and artifact_format != "onnx":
        compare = False
        notes.append(f"the {artifact_format} artifact is not compared layer by layer "
                     "(that comparison reads ONNX graphs); logits_agreement compares its "
                     "outputs")
    skip = None
    if any(isinstance(mod, torch.jit.ScriptModule) for mod in heads_removed_model.modules()):
        skip = ("the inference model is a TorchScript module, whose layers take no hooks: "
                "set policy.inference_factory to the nn.Module and policy.artifact to the "
                "TorchScript file")

    def build_adapted() -> nn.Module:
        model = build_model()
        return model if len(names) == 1 and call == "positional" else ForwardAdapter(
            model, names, call).eval()

    return PrecisionSubject(
        name=name,
        build_model=build_adapted,
        batches=[(tensors, {})],
        select_output=lambda out: select_output(out, 0),
        onnx_path=artifact_path() if compare else None,
        onnx_feeds=[dict(feeds)],
        onnx_output_name=spec.output_names[0],
        onnx_output_transform=output_transform,
        extra={"notes": notes},
        skip=skip,
    )
