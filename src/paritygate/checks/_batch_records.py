"""What batch_invariance records besides its metrics: per variant (causal LM) or per batch
layout (policy) how far a probe's numbers move with its batch, the tier and the runs made."""

from __future__ import annotations

from dataclasses import dataclass

from paritygate.records import Record


@dataclass(frozen=True)
class EngineBatchRecord(Record):
    """Causal LM: a row per batch variant, the tier, the engine and the forwards it took."""

    variants: list[dict[str, object]]
    tier: dict[str, object]
    engine: str
    batched_forwards: int
    alone_forwards: int
    declared_invariant: bool


@dataclass(frozen=True)
class PolicyBatchRecord(Record):
    """Policy: the worst output difference per batch layout, the runs and the tier."""

    layouts: dict[str, float]
    alone_runs: int
    batched_runs: int
    declared_invariant: bool
    tier: dict[str, object]
