"""Candidate engine: a TorchScript artifact (``torch.jit.save``) run by the TorchScript
interpreter on the CPU.

What loading executes: ``torch.jit.load`` reads the archive's TorchScript code and its tensor
constants with TorchScript's own restricted unpickler (tensors and TorchScript types only), so no
Python from the file runs; the TorchScript code itself runs when the artifact is called, as it
does in serving. The graph is linted before the first call (a module in training mode updates
its BatchNorm statistics when run).
"""

from __future__ import annotations

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

RANDOM_KINDS = {
    "aten::bernoulli", "aten::bernoulli_", "aten::rand", "aten::rand_like", "aten::randn",
    "aten::randn_like", "aten::randint", "aten::randint_like", "aten::randperm",
    "aten::multinomial", "aten::normal", "aten::normal_", "aten::uniform_", "aten::poisson",
    "aten::exponential_", "aten::native_dropout",
}
DROPOUT_KINDS = {"aten::dropout", "aten::feature_dropout", "aten::alpha_dropout",
                 "aten::feature_alpha_dropout"}
# the index of the ``train`` / ``training`` argument
TRAIN_ARG = {**dict.fromkeys(DROPOUT_KINDS, 2), "aten::batch_norm": 5,
             "aten::_batch_norm_impl_index": 5, "aten::native_batch_norm": 5}


def _nodes(block: Any) -> list[Any]:
    """Every node of a graph or block, nested blocks included."""
    out = []
    for node in block.nodes():
        out.append(node)
        for inner in node.blocks():
            out.extend(_nodes(inner))
    return out


def _train_flag(node: Any) -> bool | None:
    """The node's ``training`` argument: a constant's value, ``None`` when computed (a
    scripted module reads its ``training`` attribute)."""
    value = list(node.inputs())[TRAIN_ARG[node.kind()]]
    if value.node().kind() == "prim::Constant":
        return bool(value.toIValue())
    return None


def lint(module: Any, input_names: Sequence[str], declared_outputs: Sequence[str]) -> ArtifactGraph:
    """The graph of a loaded ScriptModule: training-mode dropout / BatchNorm (a constant
    ``training=True`` in the graph, or a scripted module whose flag is set), random operators,
    BatchNorm statistics and the stored weights."""
    graph = module.inlined_graph
    nodes = _nodes(graph)
    training_modules = {name or "<root>": sub.original_name for name, sub in
                        module.named_modules() if sub.training}
    flagged = {kind: [n for n, t in training_modules.items() if kind in t]
               for kind in ("Dropout", "BatchNorm")}
    bn_training: list[str] = []
    random_ops: list[str] = []
    for i, node in enumerate(nodes):
        kind = node.kind()
        label = f"{kind}#{i}"
        if kind in RANDOM_KINDS:
            random_ops.append(f"{label} (random operator)")
        elif kind in TRAIN_ARG:
            flag = _train_flag(node)
            is_bn = "batch_norm" in kind
            owners = flagged["BatchNorm" if is_bn else "Dropout"]
            if flag or (flag is None and owners):
                where = "" if flag else f" (module training flag set on {owners[:3]})"
                if is_bn:
                    bn_training.append(f"{label}{where}")
                else:
                    random_ops.append(f"{label} (dropout in training mode{where})")
    state = dict(module.state_dict())
    weights = [w for w in (float_weight(n, t) for n, t in state.items()) if w is not None]
    n_inputs = len(list(graph.inputs())) - 1  # the first is the module itself
    inputs = list(input_names[:n_inputs]) + [f"input_{i}" for i in
                                             range(len(input_names), n_inputs)]
    return ArtifactGraph(
        format="torchscript",
        input_names=inputs,
        output_names=list(declared_outputs),
        batchnorm_training=bn_training,
        batchnorm_stats=batchnorm_pairs(state),
        random_ops=random_ops,
        weights=weights,
        nodes=len(nodes),
    )


class TorchScriptEngine:
    """Runs a TorchScript artifact as served (its modules' training flags as saved); outputs
    keyed by the declared output names, in order (``output_<i>`` past them)."""

    def __init__(self, path: Path, *, input_names: Sequence[str], output_names: Sequence[str],
                 call: str = "positional", name: str | None = None) -> None:
        import torch

        self.path = path
        self.name = name or "torchscript"
        self.input_names = list(input_names)
        self.call = call
        self.fixed_batch: int | None = None
        from paritygate.checkpoints import memory_bytes
        from paritygate.reading import check_zip_members

        check_zip_members(path, "policy.artifact", what="member", max_bytes=memory_bytes())
        try:
            self.module = torch.jit.load(str(path), map_location="cpu")
        except Exception as exc:
            first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
            raise InputError(path, "policy.artifact", f"torch.jit.load cannot load the "
                             f"TorchScript artifact: {type(exc).__name__}: {first}") from None
        self.graph = lint(self.module, self.input_names, list(output_names))
        self.declared = list(output_names)
        self.output_names = list(output_names)

    def run_batch(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return run_module(self.module, feeds, self.input_names, self.call, self.declared)

    def infer(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One call, or chunks of :attr:`fixed_batch` rows when the trace fixed the batch
        (set by :meth:`find_fixed_batch`), as the ONNX and torch.export engines run."""
        return run_in_chunks(self.run_batch, feeds, self.input_names[0], self.fixed_batch)

    def find_fixed_batch(self, feeds: Mapping[str, np.ndarray]) -> int | None:
        """1 when the artifact runs one row but not two (a trace on a single example that
        baked the batch size into a reshape): recorded as the batch axis fixed to 1 in
        :attr:`graph`, the finding a ``.pt2`` or ONNX file with a constant batch gets;
        ``None`` when two rows run."""
        two = {k: v[:2] for k, v in feeds.items()}
        one = {k: v[:1] for k, v in feeds.items()}
        rows = len(next(iter(two.values())))
        try:
            out = self.run_batch(two)
            if all(len(v) == rows for v in out.values() if np.ndim(v)):
                return None
        except Exception:  # two rows failing is what is probed
            pass
        try:
            out = self.run_batch(one)
        except Exception:
            return None
        if not all(len(v) == 1 for v in out.values() if np.ndim(v)):
            return None
        self.fixed_batch = 1
        if self.input_names:
            self.graph.baked_batch[self.input_names[0]] = 1
        return 1
