"""What the checks read from an artifact's graph, whatever its format.

ONNX, TorchScript and ``torch.export`` artifacts each describe their graph differently; each
engine summarises its own into one :class:`ArtifactGraph`, so a check reads the same fields
(declared inputs and outputs, training-mode and random operators, BatchNorm statistics, the
stored weights) and never branches on the format.
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

FORMATS = ("onnx", "torchscript", "torch_export")
"""The artifact formats the gate reads (``policy.artifact_format``)."""

FORMATS_TEXT = ("ONNX (.onnx), TorchScript (torch.jit.save) and torch.export programs "
                "(torch.export.save, .pt2)")


@dataclass
class ArtifactGraph:
    """An artifact's graph as the checks see it.

    ``input_names`` / ``output_names`` are the artifact's own (a TorchScript or exported
    program names its inputs positionally: the declared names in order); ``baked_batch`` maps
    an input to the constant its batch axis is fixed to; ``weights`` are ``(name, float32
    array, stored low-precision dtype or None)`` for each floating-point tensor the artifact
    stores; ``batchnorm_stats`` are ``(label, running mean, running var)``."""

    format: str
    input_names: list[str]
    output_names: list[str]
    baked_batch: dict[str, int] = field(default_factory=dict)
    batchnorm_training: list[str] = field(default_factory=list)
    batchnorm_stats: list[tuple[str, np.ndarray, np.ndarray]] = field(default_factory=list)
    random_ops: list[str] = field(default_factory=list)
    weights: list[tuple[str, np.ndarray, str | None]] = field(default_factory=list)
    opset: int | None = None
    nodes: int = 0
    validate: Callable[[], str | None] = lambda: None
    """The format's own validator (the ONNX checker): ``None`` when it accepts the artifact,
    else its first line of complaint; formats without one accept what loaded."""


def sniff_format(path: Path) -> str | None:
    """The format a file's name and content say it is, or ``None`` when neither does: a zip
    holding ``constants.pkl`` and ``code/`` is TorchScript, one holding ``archive_format`` or
    ``models/*.json`` (or a ``.pt2`` name) a ``torch.export`` program; ``.onnx`` is ONNX."""
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
        except (OSError, zipfile.BadZipFile):
            return None
        tails = {n.split("/", 1)[1] if "/" in n else n for n in names}
        if "archive_format" in tails or any(t.startswith("models/") and t.endswith(".json")
                                            for t in tails):
            return "torch_export"
        if "constants.pkl" in tails and any(t.startswith("code/") for t in tails):
            return "torchscript"
        return "torch_export" if path.suffix == ".pt2" else None
    if path.suffix == ".pt2":
        return "torch_export"
    if path.suffix == ".onnx":
        return "onnx"
    return None


def float_weight(name: str, tensor: object) -> tuple[str, np.ndarray, str | None] | None:
    """``(name, float32 array, stored low-precision dtype or None)`` of a floating-point
    torch tensor with two or more elements; ``None`` for anything else."""
    import torch

    if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
        return None
    if tensor.numel() < 2:
        return None
    low = {torch.float16: "float16", torch.bfloat16: "bfloat16"}.get(tensor.dtype)
    return name, tensor.detach().float().cpu().numpy().copy(), low


def batchnorm_pairs(tensors: dict[str, object]) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """``(module name, running mean, running var)`` for each ``*.running_mean`` with its
    ``*.running_var`` among named tensors."""
    import torch

    rows = []
    for name, mean in tensors.items():
        if not name.endswith("running_mean"):
            continue
        var = tensors.get(name[: -len("mean")] + "var")
        if isinstance(mean, torch.Tensor) and isinstance(var, torch.Tensor):
            rows.append((name[: -len(".running_mean")] or name,
                         mean.detach().float().numpy().copy(),
                         var.detach().float().numpy().copy()))
    return rows


def run_module(module: Callable[..., object], feeds: Mapping[str, np.ndarray],
               input_names: list[str], call: str, declared: list[str]) -> dict[str, np.ndarray]:
    """One forward of a loaded TorchScript module or exported program on ``feeds``, its
    tensors named by :func:`name_outputs`; a failure on these rows is what serving would see,
    a ``ValueError`` naming the row count and the error's last line."""
    import torch

    from paritygate.engines.torch_engine import call_forward

    tensors = {n: torch.from_numpy(np.ascontiguousarray(feeds[n])) for n in input_names}
    try:
        with torch.no_grad():
            result = call_forward(module, tensors, input_names, call)
    except Exception as exc:
        lines = str(exc).strip().splitlines()
        raise ValueError(f"the artifact fails on {len(next(iter(tensors.values())))} "
                         f"row(s): {type(exc).__name__}: {lines[-1] if lines else ''}"
                         ) from None
    return {k: v.detach().float().cpu().numpy() for k, v in name_outputs(result, declared)
            if isinstance(v, torch.Tensor)}


def name_outputs(result: object, declared: list[str]) -> list[tuple[str, object]]:
    """A forward's result as ``(name, value)`` pairs: a dict by its keys, a tuple/list by
    position (the declared output names, then ``output_<i>`` past them), a tensor as the
    first declared output."""
    if isinstance(result, dict):
        return [(str(k), v) for k, v in result.items()]
    items = list(result) if isinstance(result, (tuple, list)) else [result]
    return [(declared[i] if i < len(declared) else f"output_{i}", v)
            for i, v in enumerate(items)]


def run_in_chunks(run_batch: Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]],
                  feeds: Mapping[str, np.ndarray], first_input: str,
                  fixed_batch: int | None) -> dict[str, np.ndarray]:
    """``run_batch`` on ``feeds`` in one call, or in chunks of ``fixed_batch`` rows when the
    artifact's batch axis is fixed (a trace or export that baked the batch size in); a batch
    that is no multiple of it is a ``ValueError``."""
    n = len(feeds[first_input])
    if fixed_batch is None or n == fixed_batch:
        return run_batch(feeds)
    if n % fixed_batch:
        raise ValueError(f"artifact batch axis is fixed to {fixed_batch}; cannot run batch {n}")
    chunks = [run_batch({k: v[i:i + fixed_batch] for k, v in feeds.items()})
              for i in range(0, n, fixed_batch)]
    return {name: np.concatenate([c[name] for c in chunks]) for name in chunks[0]}
