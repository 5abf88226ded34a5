"""ONNX export of an inference policy, with a manifest proving where it came from.

``manifest.json`` records the sha256 of the source checkpoint and of the
artifact, the exporter, opset and library versions; ``export_integrity`` checks
it so a stale artifact built from another checkpoint cannot ship.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

from paritygate.errors import InputError
from paritygate.golden import atomic_write_bytes, atomic_write_text


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
    # The exporter logs one warning per optional torchvision op it cannot register.
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    batch = torch.export.Dim("batch", min=1, max=1 << 16)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
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
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(path, None, f"manifest unreadable: {exc}") from None
    return data if isinstance(data, dict) else None
