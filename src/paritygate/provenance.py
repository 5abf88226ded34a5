"""Digests and versions: what golden baselines, manifests and reports record about a run, and
how an artifact's weight initializers match the checkpoint (its provenance without a manifest)."""

from __future__ import annotations

import hashlib
import platform
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from paritygate.records import Record


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Streaming sha256 of a file (checkpoints can be large)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_files(files: list[Path]) -> str:
    """sha256 of a checkpoint stored as one file (equal to ``sha256sum``) or as shards
    (digest of each shard's name and sha256, in the given order)."""
    if len(files) == 1:
        return sha256_file(files[0])
    h = hashlib.sha256()
    for path in files:
        h.update(path.name.encode())
        h.update(sha256_file(path).encode())
    return h.hexdigest()


def environment() -> dict[str, Any]:
    """Versions that influence the numbers, recorded in reports and golden provenance."""
    env: dict[str, Any] = {"python": sys.version.split()[0], "platform": platform.platform()}
    for dist in ("paritygate", "numpy", "torch", "onnx", "onnxruntime", "transformers", "vllm"):
        try:
            env[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return env


@dataclass(frozen=True)
class InitializerMatch(Record):
    """How the artifact's weight initializers match the checkpoint
    (:func:`paritygate.families.policy.initializers.match_initializers` says what each field
    means); export_integrity's record, read by the root-cause edges on it."""

    comparable: int
    matched: int
    folded: int
    unmatched: list[str]
    misplaced: dict[str, str]
    drifted: list[str]
    max_rel_drift: float
    not_in_model: list[str]
    converted: dict[str, int] = field(default_factory=dict)
    target_network: dict[str, str] = field(default_factory=dict)
    target_networks: list[str] = field(default_factory=list)
    """(The last three default to empty: a report of an earlier version lacks them.)"""
