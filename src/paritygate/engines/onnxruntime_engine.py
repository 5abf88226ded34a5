"""Candidate engine: an ONNX artifact run by ONNX Runtime on the CPU provider."""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from paritygate.engines.artifact_graph import ArtifactGraph
from paritygate.errors import InputError, MissingExtra

if TYPE_CHECKING:
    import onnx


def make_session(path: Path, *, threads: int = 1):
    """An InferenceSession with deterministic settings (one intra-op thread, no arena reuse)."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise MissingExtra("onnxruntime", "onnx") from None
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    try:
        return ort.InferenceSession(
            str(path), sess_options=opts, providers=["CPUExecutionProvider"]
        )
    except Exception as exc:
        raise InputError(path, None, f"ONNX Runtime cannot load the artifact: {exc}") from None


class OnnxRuntimeEngine:
    """Runs an ONNX artifact; splits the batch when the artifact's batch axis is fixed."""

    def __init__(self, path: Path, *, name: str = "onnxruntime") -> None:
        self.path = path
        self.name = name
        from paritygate.threads import onnxruntime_threads

        self.session = make_session(path, threads=onnxruntime_threads())
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        dim0 = self.session.get_inputs()[0].shape[0] if self.session.get_inputs() else None
        self.fixed_batch = dim0 if isinstance(dim0, int) and dim0 > 0 else None

    @cached_property
    def graph(self) -> ArtifactGraph:
        """The artifact's :class:`~paritygate.engines.artifact_graph.ArtifactGraph` (read
        from the ONNX file on first use)."""
        import onnx

        return onnx_artifact_graph(onnx.load(str(self.path)))

    def run_batch(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One session run on the feeds as given (no splitting at a fixed batch axis)."""
        arrays = {k: np.ascontiguousarray(v) for k, v in feeds.items() if k in self.input_names}
        return dict(zip(self.output_names, self.session.run(None, arrays), strict=True))

    def infer(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        arrays = {k: np.ascontiguousarray(v) for k, v in feeds.items() if k in self.input_names}
        n = next(iter(arrays.values())).shape[0]
        if self.fixed_batch is None or n == self.fixed_batch:
            outs = self.session.run(None, arrays)
            return dict(zip(self.output_names, outs, strict=True))
        step = self.fixed_batch
        if n % step:
            raise ValueError(f"artifact batch axis is fixed to {step}; cannot run batch {n}")
        chunks = [
            self.session.run(None, {k: v[i : i + step] for k, v in arrays.items()})
            for i in range(0, n, step)
        ]
        return {
            name: np.concatenate([c[j] for c in chunks]) for j, name in enumerate(self.output_names)
        }


def onnx_artifact_graph(model: onnx.ModelProto) -> ArtifactGraph:
    """An ONNX model as an :class:`~paritygate.engines.artifact_graph.ArtifactGraph`."""
    from onnx import numpy_helper

    from paritygate.onnx_lint import (
        LOW_PRECISION,
        batchnorm_initializers,
        batchnorm_training_nodes,
        random_nodes,
    )

    init_names = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in init_names]
    baked = {}
    for i in inputs:
        dims = i.type.tensor_type.shape.dim
        if len(dims) and dims[0].HasField("dim_value"):
            baked[i.name] = int(dims[0].dim_value)
    weights = []
    for init in model.graph.initializer:
        stored = LOW_PRECISION.get(init.data_type)
        arr = numpy_helper.to_array(init)
        if (stored is None and arr.dtype.kind != "f") or arr.size < 2:
            continue
        weights.append((init.name, arr.astype(np.float32), stored))

    def validate() -> str | None:
        import onnx

        try:
            onnx.checker.check_model(model, full_check=True)
        except Exception as exc:
            return str(exc).splitlines()[0][:300]
        return None

    return ArtifactGraph(
        format="onnx",
        input_names=[i.name for i in inputs],
        output_names=[o.name for o in model.graph.output],
        baked_batch=baked,
        batchnorm_training=batchnorm_training_nodes(model),
        batchnorm_stats=batchnorm_initializers(model),
        random_ops=random_nodes(model),
        weights=weights,
        opset=max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                  default=0),
        nodes=len(model.graph.node),
        validate=validate,
    )
