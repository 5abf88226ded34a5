"""The artifact's weight initializers matched against the checkpoint's tensors
(:func:`match_initializers`): the proof that an artifact holds this checkpoint, in its place."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from paritygate.provenance import InitializerMatch

if TYPE_CHECKING:
    from torch import Tensor

Weight = tuple[str, np.ndarray, "str | None"]
"""One stored tensor of an artifact: ``(name, float32 array, stored low-precision dtype or
None)``."""


@dataclass
class _Tally:
    """The per-initializer verdicts while matching."""

    comparable: int = 0
    matched: list[str] = field(default_factory=list)
    folded: list[str] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)
    drifted: list[str] = field(default_factory=list)
    misplaced: dict[str, str] = field(default_factory=dict)
    not_in_model: list[str] = field(default_factory=list)
    rel: dict[str, float] = field(default_factory=dict)
    targets: dict[str, str] = field(default_factory=dict)
    low: dict[str, str] = field(default_factory=dict)
    """initializer -> its float16/bfloat16 dtype"""


def match_initializers(
    weights: Iterable[Weight], state: Mapping[str, Tensor],
    model_state: Mapping[str, Tensor] | None = None,
) -> InitializerMatch:
    """Which of the artifact's weight initializers are this checkpoint's tensors, in their place.

    ``weights``: the artifact's stored tensors as ``(name, float32 array, stored low-precision
    dtype or None)`` (:attr:`paritygate.engines.artifact_graph.ArtifactGraph.weights`: ONNX
    initializers, a TorchScript module's or an exported program's state).

    An initializer's *role* is the parameter it stands for: its name when that names a
    checkpoint tensor or a parameter of the inference model (``model_state``). With a
    role in the checkpoint it *matches* only that tensor (as stored or transposed); it is
    *folded* when it equals it up to one scale per output channel (a BatchNorm folded into
    the preceding Conv/Gemm; that layer's bias then differs too and counts as folded),
    *misplaced* when it equals another checkpoint tensor (a
    tensor exported into the wrong layer) and *drifted* when it has the role tensor's shape
    but other values (``max_rel_drift``: the largest |difference| / max |tensor|). Without
    a role it matches any checkpoint tensor of its value. A float16 or bfloat16 initializer (a
    precision-converted artifact) is compared with the checkpoint tensors cast to its dtype;
    ``converted`` counts those that match or fold, by dtype. ``not_in_model`` names matched
    initializers whose inference-model parameter of the same name holds other values (the
    checkpoint did not load into it). ``comparable`` counts initializers (floating point,
    2+ elements) with a checkpoint tensor of their shape. ``target_network`` maps each
    initializer whose values are found only under a target network's tensors
    (:func:`target_network`: ``q_net_target``, ``actor_target``, ``target_qf1``) to that
    tensor (``target_networks``: their names): an artifact built from a training-only copy of
    the policy, whatever the initializers are named; such an initializer is unmatched, never
    matched or misplaced.
    """
    named = _float_arrays(state)
    model = _float_arrays(model_state or {})
    by_shape: dict[tuple[int, ...], list[tuple[str, np.ndarray]]] = {}
    for name, arr in named.items():
        by_shape.setdefault(tuple(arr.shape), []).append((name, arr))
    tally = _Tally()
    for init_name, arr, stored in weights:
        pool = list(by_shape.get(tuple(arr.shape), []))
        if arr.ndim == 2:
            pool += [(n, t.T) for n, t in by_shape.get(tuple(arr.shape[::-1]), [])]
        if not pool:
            continue
        tally.comparable += 1
        _judge(tally, init_name, arr, stored, pool, named.get(init_name))
        own = model.get(init_name)
        if stored is not None and own is not None:
            own = cast_rounded(own, stored)
        if init_name in tally.matched and own is not None and not _same(arr, own):
            tally.not_in_model.append(init_name)
        if stored is not None:
            tally.low[init_name] = stored
    return _summary(tally)


def _judge(tally: _Tally, init_name: str, arr: np.ndarray, stored: str | None,
           pool: list[tuple[str, np.ndarray]], role_fp32: np.ndarray | None) -> None:
    """Record one comparable initializer as matched, folded, misplaced, drifted or unmatched
    (``pool``: the checkpoint tensors of its shape; ``role_fp32``: the one of its name)."""
    role = role_fp32
    rtol = 1e-5
    if stored is not None:  # compare with the checkpoint cast to the artifact's dtype
        pool = [(n, cast_rounded(t, stored)) for n, t in pool]
        role = None if role is None else cast_rounded(role, stored)
        rtol = 4 * UNIT_ROUNDOFF[stored]
    equal = [n for n, t in pool if np.array_equal(arr, t)]
    from_target = [n for n in equal if target_network(n)]
    if from_target and len(from_target) == len(equal) and np.ptp(arr) > 0:
        # only a target network holds these values (under any initializer name, its own
        # included): the artifact serves the training-only copy
        tally.targets[init_name] = from_target[0]
        tally.unmatched.append(init_name)
    elif role is None:  # no checkpoint tensor of this name: any of its value matches
        (tally.matched if equal else tally.unmatched).append(init_name)
    elif _same(arr, role):
        tally.matched.append(init_name)
    elif role_fp32 is not None and _channel_scaled(arr, role_fp32, rtol):
        tally.folded.append(init_name)
    elif equal and np.ptp(arr) > 0:  # a constant (all ones, zeros) places nothing
        tally.misplaced[init_name] = equal[0]
        tally.unmatched.append(init_name)
    else:
        tally.unmatched.append(init_name)
        ref = role if role.shape == arr.shape else role.T
        if ref.shape == arr.shape:
            tally.drifted.append(init_name)
            scale = float(np.abs(ref).max()) or 1.0
            tally.rel[init_name] = float(np.abs(arr - ref).max()) / scale


def _summary(tally: _Tally) -> InitializerMatch:
    unmatched, folded = tally.unmatched, tally.folded
    # A folded layer's bias absorbs the BatchNorm shift: folded with its weight.
    for name in [n for n in unmatched if n.endswith(".bias") and n not in tally.misplaced]:
        if name[: -len("bias")] + "weight" in folded:
            unmatched.remove(name)
            folded.append(name)
    drifted = [n for n in tally.drifted if n in unmatched]
    converted: dict[str, int] = {}
    for name in [*tally.matched, *folded]:
        if name in tally.low:
            converted[tally.low[name]] = converted.get(tally.low[name], 0) + 1
    return InitializerMatch(
        comparable=tally.comparable,
        matched=len(tally.matched),
        folded=len(folded),
        unmatched=unmatched,
        misplaced=tally.misplaced,
        drifted=drifted,
        max_rel_drift=max((tally.rel[n] for n in drifted), default=0.0),
        not_in_model=tally.not_in_model,
        converted=converted,
        target_network=tally.targets,
        target_networks=sorted({str(target_network(t)) for t in tally.targets.values()}),
    )


def target_network(name: str) -> str | None:
    """The target-network part of a tensor name (``q_net_target``, ``actor_target``,
    ``critic_target``, CleanRL's ``target_network`` / ``qf1_target``, ``target_qf1``): a
    training-only copy of a network that the policy lags behind; ``None`` otherwise."""
    for part in name.split(".")[:-1]:
        low = part.lower()
        if low.endswith("_target") or low.startswith("target_") or low == "target":
            return part
    return None


LOW_PRECISION_INITIALIZERS = {10: "float16", 16: "bfloat16"}
UNIT_ROUNDOFF = {"float16": 2.0**-11, "bfloat16": 2.0**-8}
"""ONNX ``TensorProto`` data types of a precision-converted artifact's weights (FLOAT16,
BFLOAT16), by the dtype name the config declares."""


def cast_rounded(array: np.ndarray, dtype: str) -> np.ndarray:
    """``array`` (float32) rounded to ``dtype`` as a conversion tool stores it, back in float32:
    the checkpoint tensor a converted initializer must equal."""
    import torch

    rounded: np.ndarray = torch.from_numpy(array).to(getattr(torch, dtype)).float().numpy()
    return rounded


def _float_arrays(state: Mapping[str, Tensor]) -> dict[str, np.ndarray]:
    out = {}
    for name, t in state.items():
        if getattr(t, "is_floating_point", lambda: False)() and t.numel() >= 2:
            out[name] = t.detach().float().cpu().numpy()
    return out


def _same(arr: np.ndarray, ref: np.ndarray) -> bool:
    """Equal as stored, or transposed (a 2-D weight stored for Gemm/MatMul)."""
    if arr.shape == ref.shape and np.array_equal(arr, ref):
        return True
    return arr.ndim == 2 and arr.shape == ref.shape[::-1] and np.array_equal(arr, ref.T)


def _channel_scaled(arr: np.ndarray, ref: np.ndarray, rtol: float = 1e-5) -> bool:
    """``arr == ref * s`` with one scale ``s`` per output channel (axis 0), ``ref.ndim >= 2``,
    to ``rtol`` of each channel's largest value."""
    if arr.shape != ref.shape or ref.ndim < 2:
        return False
    a, r = arr.reshape(len(arr), -1).astype(np.float64), ref.reshape(len(ref), -1)
    norm = (r * r).sum(1)
    if np.any(norm == 0):
        return False
    scale = (a * r).sum(1) / norm  # least-squares per-channel scale
    resid = np.abs(a - scale[:, None] * r).max(1)
    return bool(np.all(resid <= rtol * np.maximum(np.abs(a).max(1), 1e-12)))
