"""ONNX export of an inference policy, with a manifest proving where it came from.

``manifest.json`` records the sha256 of the source checkpoint and of the
artifact, the exporter, opset and library versions; ``export_integrity`` checks
it so a stale artifact built from another checkpoint cannot ship.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from paritygate.errors import InputError
from paritygate.files import atomic_write_bytes, atomic_write_text

EXPORTER_NOISE_LOGGERS: tuple[str, ...] = (
    # one warning per optional torchvision op the exporter cannot register
    "torch.onnx._internal.exporter._registration",
    # "Evaluation failed: cannot reshape array ...": constant folding tried an op on a
    # symbolic (dynamic batch) shape, gave up and kept the node; the export is unaffected
    "onnxscript.optimizer._constant_folding",
)


@contextlib.contextmanager
def quiet_exporter() -> Iterator[None]:
    """Silence the exporter's known-harmless log lines and warnings for one export only."""
    loggers = [logging.getLogger(name) for name in EXPORTER_NOISE_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def export_onnx(
    model: Any,
    example: Any,
    path: Path,
    *,
    input_name: str,
    output_names: list[str],
    opset: int = 18,
) -> Path:
    """Export ``model`` (eval mode) with a dynamic batch axis, through torch's dynamo exporter.

    The file is written atomically: the export goes to a temp folder first.
    """
    import torch

    model.eval()
    batch = torch.export.Dim("batch", min=1, max=1 << 16)
    with tempfile.TemporaryDirectory() as tmp, quiet_exporter():
        tmp_path = Path(tmp) / "model.onnx"
        program = torch.onnx.export(
            model,
            (example,),
            input_names=[input_name],
            output_names=output_names,
            opset_version=opset,
            dynamo=True,
            dynamic_shapes=({0: batch},),
            external_data=False,
            verbose=False,
        )
        program.save(str(tmp_path))
        atomic_write_bytes(path, tmp_path.read_bytes())
    return path


def export_policy(
    config: Any,
    model: Any,
    report: Any,
    ckpt: Path,
    probes: Any,
    out: Path,
) -> Path:
    """Export the inference model the checks inspect (loaded, ``report`` its load) to
    ``out/policy.onnx`` with its manifest; the artifact path."""
    import torch

    spec = config.policy
    assert spec is not None
    if report.missing or report.shape_mismatch:
        raise InputError(
            ckpt,
            "state_dict",
            "cannot export: the inference model does not load "
            f"from the checkpoint (missing {report.missing[:3]}, shape "
            f"{[m[0] for m in report.shape_mismatch[:3]]})",
        )
    example = torch.from_numpy(probes[: min(2, len(probes))])
    artifact = export_onnx(
        model.eval(),
        example,
        out / "policy.onnx",
        input_name=spec.input_name,
        output_names=list(spec.output_names),
        opset=spec.opset,
    )
    write_manifest(artifact, ckpt, opset=spec.opset)
    return artifact


def write_manifest(
    artifact: Path, checkpoint: Path, *, opset: int, extra: dict[str, Any] | None = None
) -> Path:
    """Write ``manifest.json`` beside ``artifact``."""
    from paritygate.provenance import environment, sha256_file

    manifest = {
        "artifact": artifact.name,
        "artifact_sha256": sha256_file(artifact),
        "checkpoint": os.path.relpath(checkpoint, artifact.parent),
        "checkpoint_sha256": sha256_file(checkpoint),
        "exporter": "torch.onnx.export(dynamo=True)",
        "opset": opset,
        "versions": environment(),
        **(extra or {}),
    }
    path = artifact.parent / "manifest.json"
    atomic_write_text(path, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return path


def read_manifest(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # ValueError: JSON syntax and non-UTF-8 bytes
        raise InputError(path, "policy.manifest", f"manifest unreadable: {exc}") from None
    if not isinstance(data, dict):
        raise InputError(
            path, "policy.manifest", f"manifest is not a JSON object (got {type(data).__name__})"
        )
    return data


def match_initializers(
    onnx_model: Any, state: dict[str, Any], model_state: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Which of the artifact's weight initializers are this checkpoint's tensors, in their place.

    An initializer's *role* is the parameter it stands for: its name when that names a
    checkpoint tensor or a parameter of the inference model (``model_state``). With a
    role in the checkpoint it *matches* only that tensor (as stored or transposed); it is
    *folded* when it equals it up to one scale per output channel (a BatchNorm folded into
    the preceding Conv/Gemm; that layer's bias then differs too and counts as folded),
    *misplaced* when it equals another checkpoint tensor (a
    tensor exported into the wrong layer) and *drifted* when it has the role tensor's shape
    but other values (``max_rel_drift``: the largest |difference| / max |tensor|). Without
    a role it matches any checkpoint tensor of its value. ``not_in_model`` names matched
    initializers whose inference-model parameter of the same name holds other values (the
    checkpoint did not load into it). ``comparable`` counts initializers (floating point,
    2+ elements) with a checkpoint tensor of their shape.
    """
    import numpy as np
    from onnx import numpy_helper

    named = _float_arrays(state)
    model = _float_arrays(model_state or {})
    by_shape: dict[tuple[int, ...], list[tuple[str, np.ndarray]]] = {}
    for name, arr in named.items():
        by_shape.setdefault(tuple(arr.shape), []).append((name, arr))
    matched, folded, unmatched, drifted, comparable = [], [], [], [], 0
    misplaced: dict[str, str] = {}
    not_in_model: list[str] = []
    rel: dict[str, float] = {}
    for init in onnx_model.graph.initializer:
        arr = numpy_helper.to_array(init)
        if arr.dtype.kind != "f" or arr.size < 2:
            continue
        arr = arr.astype(np.float32)
        pool = list(by_shape.get(tuple(arr.shape), []))
        if arr.ndim == 2:
            pool += [(n, t.T) for n, t in by_shape.get(tuple(arr.shape[::-1]), [])]
        if not pool:
            continue
        comparable += 1
        equal = [n for n, t in pool if np.array_equal(arr, t)]
        role = named.get(init.name)
        if role is None:  # no checkpoint tensor of this name: any of its value matches
            (matched if equal else unmatched).append(init.name)
        elif _same(arr, role):
            matched.append(init.name)
        elif _channel_scaled(arr, role):
            folded.append(init.name)
        elif equal and np.ptp(arr) > 0:  # a constant (all ones, zeros) places nothing
            misplaced[init.name] = equal[0]
            unmatched.append(init.name)
        else:
            unmatched.append(init.name)
            ref = role if role.shape == arr.shape else role.T
            if ref.shape == arr.shape:
                drifted.append(init.name)
                scale = float(np.abs(ref).max()) or 1.0
                rel[init.name] = float(np.abs(arr - ref).max()) / scale
        own = model.get(init.name)
        if init.name in matched and own is not None and not _same(arr, own):
            not_in_model.append(init.name)
    # A folded layer's bias absorbs the BatchNorm shift: folded with its weight.
    for name in [n for n in unmatched if n.endswith(".bias") and n not in misplaced]:
        if name[: -len("bias")] + "weight" in folded:
            unmatched.remove(name)
            folded.append(name)
    drifted = [n for n in drifted if n in unmatched]
    return {
        "comparable": comparable,
        "matched": len(matched),
        "folded": len(folded),
        "unmatched": unmatched,
        "misplaced": misplaced,
        "drifted": drifted,
        "max_rel_drift": max((rel[n] for n in drifted), default=0.0),
        "not_in_model": not_in_model,
    }


def _float_arrays(state: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for name, t in state.items():
        if getattr(t, "is_floating_point", lambda: False)() and t.numel() >= 2:
            out[name] = t.detach().float().cpu().numpy()
    return out


def _same(arr: Any, ref: Any) -> bool:
    """Equal as stored, or transposed (a 2-D weight stored for Gemm/MatMul)."""
    import numpy as np

    if arr.shape == ref.shape and np.array_equal(arr, ref):
        return True
    return arr.ndim == 2 and arr.shape == ref.shape[::-1] and np.array_equal(arr, ref.T)


def _channel_scaled(arr: Any, ref: Any) -> bool:
    """``arr == ref * s`` with one scale ``s`` per output channel (axis 0), ``ref.ndim >= 2``."""
    import numpy as np

    if arr.shape != ref.shape or ref.ndim < 2:
        return False
    a, r = arr.reshape(len(arr), -1).astype(np.float64), ref.reshape(len(ref), -1)
    norm = (r * r).sum(1)
    if np.any(norm == 0):
        return False
    scale = (a * r).sum(1) / norm  # least-squares per-channel scale
    resid = np.abs(a - scale[:, None] * r).max(1)
    return bool(np.all(resid <= 1e-5 * np.maximum(np.abs(a).max(1), 1e-12)))
