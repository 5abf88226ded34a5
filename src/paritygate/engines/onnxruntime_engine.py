"""Candidate engine: an ONNX artifact run by ONNX Runtime on the CPU provider."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from paritygate.errors import InputError, MissingExtra


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
        self.session = make_session(path)
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        dim0 = self.session.get_inputs()[0].shape[0] if self.session.get_inputs() else None
        self.fixed_batch = dim0 if isinstance(dim0, int) and dim0 > 0 else None

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
