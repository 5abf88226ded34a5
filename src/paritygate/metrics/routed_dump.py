"""A rollout dump's recorded routing (``routed_experts``, see
:mod:`paritygate.engines.dump_routing`) against the trainer's recompute over the dump's own
tokens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from paritygate.errors import InputError
from paritygate.records import Record

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from torch import nn

    from paritygate.engines.hf_routing import MoeLayout
    from paritygate.engines.rollout_dump import DumpRecord
    from paritygate.metrics.routing import LayerRouting
    from paritygate.result import Measurement


@dataclass(frozen=True)
class DumpAudited(Record):
    """How many of the dump's records carried their routing."""

    dump_records_audited: int


def dump_layers(
    m: Measurement, records: Sequence[DumpRecord], training: nn.Module, layout: MoeLayout,
    tie: float, *, pad_id: int, required: bool, dump_path: Path,
) -> list[LayerRouting] | None:
    """Per MoE layer, the dump's routing against the trainer's on the recorded positions;
    ``None`` (with a note) when no record carries ``routed_experts``. ``required``: a record
    without the field is bad input naming it. A layer count other than the model's is bad
    input; another top-k is compared as such (every token differs)."""
    import numpy as np

    from paritygate.engines.hf_routing import positions, routed_forward
    from paritygate.metrics.routing import compare_layer

    carried = [i for i, r in enumerate(records) if r["routed_experts"] is not None]
    if required and len(carried) < len(records):
        first = next(i for i, r in enumerate(records) if r["routed_experts"] is None)
        raise InputError(dump_path, f"record {first + 1}: routed_experts",
                         "required field missing (causal_lm.routing.dump_experts: true)")
    if not carried:
        m.note("the dump's records carry no routed_experts: the engine's routing is not "
               "audited (set causal_lm.routing.dump_experts: true to require it)")
        return None
    layers = len(layout.routers)
    seqs = [records[i]["prompt_ids"] + records[i]["completion_ids"] for i in carried]
    for i in carried:
        routed = records[i]["routed_experts"] or []
        if routed and len(routed[0]) != layers:
            raise InputError(dump_path, f"record {i + 1}: routed_experts",
                             f"{len(routed[0])} MoE layers per position; the model has {layers}")
    capture, mask = routed_forward(training, layout, seqs, pad_id)
    flat: list[int] = []
    recorded: list[list[list[int]]] = []
    for seq_pos, i in zip(positions(seqs), carried, strict=True):
        routed = records[i]["routed_experts"] or []
        flat += seq_pos[: len(routed)]
        recorded += routed
    engine = np.asarray(recorded, dtype=np.int64)  # (N, L, K)
    if engine.shape[-1] != layout.top_k:
        m.fail("top_k_differs", f"the dump's engine routed each token to {engine.shape[-1]} "
                                f"experts, the trainer routes to {layout.top_k}")
    every = mask | ~mask  # all captured positions, padding included; ``flat`` indexes them
    out = []
    for li, router in enumerate(layout.routers):
        full = capture.layer(router, every)
        trainer = {k: v[flat] for k, v in full.items()}
        out.append(compare_layer(router, trainer,
                                 {"logits": None, "experts": engine[:, li, :], "weights": None},
                                 tie))
    m.record(DumpAudited(len(carried)))
    return out
