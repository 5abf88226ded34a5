"""The serving copy of a causal-LM checkpoint: training-only heads removed, nothing else changed.

``paritygate export`` on a causal-LM config writes ``<out>/model/`` (every non-weight file of
the training directory copied as is, each safetensors file rewritten without the keys under
``training_only_heads``, tensors bit-identical) and ``<out>/manifest.json`` with the sha256 of
the source checkpoint and of every file written. The training directory is only read.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paritygate.engines.hf_loading import safetensors_files
from paritygate.errors import InputError
from paritygate.families.causal_lm.weights import is_training_only
from paritygate.files import atomic_write_bytes, atomic_write_text
from paritygate.reading import check_input
from paritygate.reading_text import read_json

if TYPE_CHECKING:
    from paritygate.config import GateConfig


def write_serving_copy(source: Path, target: Path, heads: list[str]) -> list[str]:
    """Copy the HF directory ``source`` into ``target`` without the keys under ``heads``
    (tensors bit-identical, every other file as is); returns the removed keys."""
    from safetensors import safe_open
    from safetensors.torch import save

    target.mkdir(parents=True, exist_ok=True)
    removed: list[str] = []
    weight_map: dict[str, str] = {}
    for shard in safetensors_files(source):
        kept: dict[str, Any] = {}
        with safe_open(str(shard), framework="pt") as fh:
            metadata = fh.metadata()
            for key in fh.keys():  # noqa: SIM118 (safe_open has no __iter__)
                if is_training_only(key, heads):
                    removed.append(key)
                else:
                    kept[key] = fh.get_tensor(key)
                    weight_map[key] = shard.name
        atomic_write_bytes(target / shard.name, save(kept, metadata=metadata))
    for path in sorted(source.iterdir()):
        if path.is_file() and path.suffix != ".safetensors" and path.name != (
            "model.safetensors.index.json"
        ):
            check_input(path, None, what="model file")  # a sparse file is not copied out
            shutil.copyfile(path, target / path.name)
    index = source / "model.safetensors.index.json"
    if index.is_file():
        data = read_json(index, None, what="index")
        data["weight_map"] = dict(sorted(weight_map.items()))
        atomic_write_text(target / index.name, json.dumps(data, indent=2) + "\n")
    return removed


def training_only_keys(model_dir: Path, heads: list[str]) -> list[str]:
    """Keys of ``model_dir``'s safetensors files under ``heads`` (headers only, no tensors)."""
    from safetensors import safe_open

    found: list[str] = []
    for shard in safetensors_files(model_dir):
        with safe_open(str(shard), framework="pt") as fh:
            found += [k for k in fh.keys() if is_training_only(k, heads)]  # noqa: SIM118
    return found


_SERVABLE: dict[tuple[str, tuple[str, ...]], Path] = {}


def servable_copy(model_dir: Path, heads: list[str]) -> Path:
    """``model_dir``, or, when it holds keys under ``heads``, a temporary copy without them
    (written once per process and directory, removed at exit): what an engine that refuses
    unknown parameters (vLLM) can load."""
    key = (str(model_dir), tuple(heads))
    if key not in _SERVABLE:
        served = model_dir
        if heads and training_only_keys(model_dir, heads):
            import atexit
            import tempfile

            tmp = Path(tempfile.mkdtemp(prefix="paritygate-serving-"))
            atexit.register(shutil.rmtree, tmp, ignore_errors=True)
            write_serving_copy(model_dir, tmp / "model", heads)
            served = tmp / "model"
        _SERVABLE[key] = served
    return _SERVABLE[key]


def export_serving_copy(config: GateConfig, out_dir: Path) -> Path:
    """Write the serving copy of ``config``'s model directory; returns the manifest path."""
    from paritygate.provenance import environment, sha256_file, sha256_files

    spec = config.causal_lm
    assert spec is not None
    source = spec.model_dir
    shards = safetensors_files(source)
    if not shards:
        raise InputError(source, "causal_lm.model_dir", "no safetensors weights in the directory")
    target = out_dir / "model"
    removed = write_serving_copy(source, target, list(spec.training_only_heads))
    files = sorted(p.name for p in target.iterdir() if p.is_file())
    manifest = {
        "artifact": "model",
        "files": {name: sha256_file(target / name) for name in files},
        "checkpoint": str(source),
        "checkpoint_sha256": sha256_files(shards),
        "removed_keys": sorted(removed),
        "exporter": "paritygate export (safetensors, training-only heads removed)",
        "versions": environment(),
    }
    path = out_dir / "manifest.json"
    atomic_write_text(path, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return path
