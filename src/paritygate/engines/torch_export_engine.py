"""Candidate engine: a ``torch.export`` program (``torch.export.save``, ``.pt2``) run on the CPU.

What loading executes: in torch 2.13 ``torch.export.load`` reads the graph from JSON, but
weights and constants the saver could not store raw are read with ``torch.load(...,
weights_only=False)`` and opaque objects with ``pickle.loads`` (``torch/export/pt2_archive/
_package.py``; its docstring: "uses pickle under the hood ... Never load data from an untrusted
source"). It cannot promise that no Python from the file runs, so the gate loads a ``.pt2``
only with ``allow_pickle: true``, as for pickled checkpoints.
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from paritygate.engines.artifact_graph import (
    ArtifactGraph,
    batchnorm_pairs,
    float_weight,
    run_in_chunks,
    run_module,
)
from paritygate.errors import InputError

RANDOM_OPS = {
    "bernoulli", "bernoulli_", "rand", "rand_like", "randn", "randn_like", "randint",
    "randint_like", "randperm", "multinomial", "normal", "normal_", "uniform", "uniform_",
    "poisson", "exponential", "exponential_", "native_dropout",
}
DROPOUT_OPS = {"dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout"}
# the index of the ``train`` / ``training`` argument
TRAIN_ARG = {**dict.fromkeys(DROPOUT_OPS, 2), "batch_norm": 5, "native_batch_norm": 5,
             "_native_batch_norm_legit": 5, "_native_batch_norm_legit_functional": 5,
             "_batch_norm_with_update": None, "_batch_norm_with_update_functional": None}


def _op_name(target: object) -> str:
    """``aten.dropout.default`` -> ``dropout``."""
    schema = getattr(target, "_schema", None)
    if schema is not None:
        return str(schema.name).split("::")[-1]
    return getattr(target, "__name__", str(target)).split(".")[0]


def lint(program: Any, input_names: Sequence[str],
         declared_outputs: Sequence[str]) -> ArtifactGraph:
    """The graph of an ExportedProgram, read from its nodes: training-mode dropout /
    BatchNorm (``training=True`` arguments, running statistics the program mutates), random
    operators, static batch axes, BatchNorm statistics and the stored weights."""
    bn_training: list[str] = []
    random_ops: list[str] = []
    nodes = list(program.graph.nodes)
    for node in nodes:
        if node.op != "call_function":
            continue
        op = _op_name(node.target)
        label = f"{node.name} ({op})"
        if op in RANDOM_OPS:
            random_ops.append(label)
        elif op in TRAIN_ARG:
            index = TRAIN_ARG[op]
            flag = True if index is None else (
                node.args[index] if len(node.args) > index
                else node.kwargs.get("train", node.kwargs.get("training", False)))
            if flag is True:
                (bn_training if "batch_norm" in op else random_ops).append(label)
    mutated = [b for b in program.graph_signature.buffers_to_mutate.values()
               if "running_" in b]
    if mutated and not bn_training:
        bn_training.append(f"running statistics updated by the program: {mutated[:3]}")
    tensors: dict[str, Any] = {**program.state_dict, **dict(program.constants)}
    weights = [w for w in (float_weight(n, t) for n, t in tensors.items()) if w is not None]
    user_inputs = list(program.graph_signature.user_inputs)
    placeholders = {n.name: n for n in nodes if n.op == "placeholder"}
    inputs = list(input_names[:len(user_inputs)]) + [f"input_{i}" for i in
                                                      range(len(input_names), len(user_inputs))]
    baked: dict[str, int] = {}
    for name, user in zip(inputs, user_inputs, strict=False):
        val = placeholders[user].meta.get("val") if user in placeholders else None
        shape = getattr(val, "shape", None)
        if shape is not None and len(shape) and isinstance(shape[0], int):
            baked[name] = int(shape[0])
    n_out = len(program.graph_signature.user_outputs)
    outputs = list(declared_outputs[:n_out]) + [f"output_{i}" for i in
                                                 range(len(declared_outputs), n_out)]
    return ArtifactGraph(
        format="torch_export",
        input_names=inputs,
        output_names=outputs,
        baked_batch=baked,
        batchnorm_training=bn_training,
        batchnorm_stats=batchnorm_pairs(tensors),
        random_ops=random_ops,
        weights=weights,
        nodes=len(nodes),
    )


class TorchExportEngine:
    """Runs an exported program (``ExportedProgram.module()``); outputs keyed by the declared
    output names in order. A batch axis exported as a constant is run in chunks of it, as the
    ONNX engine does; :meth:`run_batch` runs one call as given."""

    def __init__(self, path: Path, *, input_names: Sequence[str], output_names: Sequence[str],
                 call: str = "positional", allow_pickle: bool = False,
                 name: str | None = None) -> None:
        if not allow_pickle:
            raise InputError(
                path, "allow_pickle",
                "a torch.export program (.pt2) is read by torch.export.load, which may unpickle "
                "Python objects stored in the file; set allow_pickle: true to opt in for a "
                "file you trust")
        import torch

        self.path = path
        self.name = name or "torch.export"
        self.input_names = list(input_names)
        self.call = call
        self.declared = list(output_names)
        import logging

        from paritygate.checkpoints import memory_bytes
        from paritygate.reading import check_zip_members

        if not zipfile.is_zipfile(path):
            raise InputError(path, "policy.artifact", "not a torch.export program: a .pt2 is a "
                             "zip archive and this file is none (truncated or another format)")
        check_zip_members(path, "policy.artifact", what="member", max_bytes=memory_bytes())
        logging.disable(logging.CRITICAL)  # torch logs its own traceback before raising
        try:
            self.program = torch.export.load(str(path))
            self.module = self.program.module()
        except Exception as exc:
            first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
            raise InputError(path, "policy.artifact", f"torch.export.load cannot load the "
                             f"program: {type(exc).__name__}: {first}") from None
        finally:
            logging.disable(logging.NOTSET)
        self.graph = lint(self.program, self.input_names, self.declared)
        self.output_names = self.graph.output_names
        baked = self.graph.baked_batch.get(self.input_names[0]) if self.input_names else None
        self.fixed_batch = baked if baked and baked > 0 else None

    def run_batch(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return run_module(self.module, feeds, self.input_names, self.call, self.declared)

    def infer(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return run_in_chunks(self.run_batch, feeds, self.input_names[0], self.fixed_batch)
