"""The policy zoo of ``batch_invariance``: artifacts and serving paths whose outputs for one
observation depend (or do not) on the batch it is served in.

Each entry's builder writes into ``out`` (the clean demo is only read) and returns the config
overrides that gate it; a fault names the finding kind it must fail with, a clean twin passes,
and a ``skip`` entry names the reason its check is skipped with.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import format_zoo
import numpy as np
import policy_zoo_builders as zb

Overrides = dict[str, Any]


def normalize_batch_stats(raw: np.ndarray, *, stats_path: str | Path) -> np.ndarray:
    """A serving normaliser that re-centres each batch on its own mean (a "running" statistic
    computed over the request batch): a row's model input depends on its batch-mates."""
    from paritygate.demo.policy import normalize_serving

    z = normalize_serving(raw, stats_path=stats_path)
    return (z - z.mean(axis=0, keepdims=True) + z.mean()).astype(np.float32)


def _serving(name: str) -> Callable[[Path, Path], Overrides]:
    def build(clean: Path, out: Path) -> Overrides:
        return {"policy": {"preprocessing": {"serving": f"batch_zoo:{name}"}}}

    return build


def _declared(build: Callable[[Path, Path], Overrides]) -> Callable[[Path, Path], Overrides]:
    def declared(clean: Path, out: Path) -> Overrides:
        overrides = build(clean, out)
        overrides.setdefault("policy", {})["batch_invariant"] = True
        return overrides

    return declared


def _demo(clean: Path, out: Path) -> Overrides:
    return {}


@dataclass(frozen=True)
class BatchEntry:
    id: str
    summary: str
    build: Callable[[Path, Path], Overrides]
    kind: str | None = None
    """The finding kind a fault fails with; ``None``: a clean twin (passes)."""
    skip: str | None = None
    """Text the skip reason holds (an artifact that cannot batch)."""


ENTRIES = (
    BatchEntry("onnx_clean", "the demo's ONNX artifact (dynamic batch axis)", _demo),
    BatchEntry("torchscript_clean", "traced TorchScript of the clean checkpoint",
               format_zoo.torchscript()),
    BatchEntry("pt2_clean", "torch.export program (dynamic batch) of the clean checkpoint",
               format_zoo.exported()),
    BatchEntry("onnx_bn_training", "ONNX exported in training mode: BatchNorm uses batch stats",
               zb.artifact_fault(zb.bn_training_export), "batch_statistics"),
    BatchEntry("torchscript_bn_training", "TorchScript traced in training mode",
               format_zoo.torchscript(train=True), "batch_statistics"),
    BatchEntry("pt2_bn_training", "torch.export program exported in training mode",
               format_zoo.exported(train=True), "batch_statistics"),
    BatchEntry("serving_batch_stats", "serving preprocessing re-centres on the batch mean",
               _serving("normalize_batch_stats"), "preprocessing_batch_dependent"),
    BatchEntry("onnx_fixed_batch", "legacy export without a dynamic batch axis (batch 2)",
               zb.artifact_fault(zb.baked_batch), skip="batch axis is fixed to 2"),
    # torch's CPU kernels sum in a batch-shaped order (1.2e-6 on the demo): noise for the fp32
    # tier, a fault where bitwise invariance is declared; ONNX Runtime's are bitwise here.
    BatchEntry("pt2_declared", "the torch.export program declared batch invariant",
               _declared(format_zoo.exported()), "not_bitwise"),
    BatchEntry("onnx_declared_clean", "the ONNX artifact declared batch invariant",
               _declared(_demo)),
)
ENTRIES_BY_ID = {e.id: e for e in ENTRIES}
