"""Graph lint for ONNX artifacts: training-mode and random operators, BatchNorm initializers."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnx

LOW_PRECISION = {10: "float16", 16: "bfloat16"}
"""ONNX ``TensorProto`` data types of low-precision weights (FLOAT16, BFLOAT16)."""

RANDOM_OPS = {
    "RandomNormal",
    "RandomUniform",
    "RandomNormalLike",
    "RandomUniformLike",
    "Bernoulli",
    "Multinomial",
}


def _attr(node: onnx.NodeProto, name: str) -> object:
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            value: object = helper.get_attribute_value(a)
            return value
    return None


def _constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Initializers and Constant-node outputs, by tensor name."""
    from onnx import TensorProto, numpy_helper

    out = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            value = _attr(node, "value")
            if isinstance(value, TensorProto):
                out[node.output[0]] = numpy_helper.to_array(value)
    return out


def _label(node: onnx.NodeProto) -> str:
    return node.name or f"{node.op_type}->{node.output[0] if node.output else '?'}"


def all_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Nodes of the main graph and of local functions (the dynamo exporter may emit functions)."""
    nodes = list(model.graph.node)
    for fn in model.functions:
        nodes.extend(fn.node)
    return nodes


def batchnorm_training_nodes(model: onnx.ModelProto) -> list[str]:
    """BatchNormalization nodes exported in training mode (training_mode=1 or extra outputs)."""
    bad = []
    for node in all_nodes(model):
        if node.op_type != "BatchNormalization":
            continue
        outputs = [o for o in node.output if o]
        if _attr(node, "training_mode") == 1 or len(outputs) > 1:
            bad.append(_label(node))
    return bad


def batchnorm_initializers(model: onnx.ModelProto) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(node label, mean, var) of each BatchNormalization node whose stats are constants."""
    consts = _constants(model)
    rows = []
    for node in all_nodes(model):
        if node.op_type == "BatchNormalization" and len(node.input) >= 5:
            mean, var = consts.get(node.input[3]), consts.get(node.input[4])
            if mean is not None and var is not None:
                rows.append((_label(node), mean, var))
    return rows


def random_nodes(model: onnx.ModelProto) -> list[str]:
    """Random operators, and Dropout nodes whose training_mode input is a true constant."""
    consts = _constants(model)
    bad = [f"{_label(n)} ({n.op_type})" for n in all_nodes(model) if n.op_type in RANDOM_OPS]
    for node in all_nodes(model):
        if node.op_type != "Dropout":
            continue
        if len(node.input) >= 3 and node.input[2]:
            flag = consts.get(node.input[2])
            if flag is None or bool(np.asarray(flag).reshape(-1)[0]):
                bad.append(f"{_label(node)} (Dropout in training mode)")
    return bad

