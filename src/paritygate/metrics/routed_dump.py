"""A rollout dump's recorded routing (``routed_experts``, see
:mod:`paritygate.engines.dump_routing`) against the trainer's recompute over the dump's own
tokens, one batch of records at a time (memory does not grow with the dump)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from paritygate.errors import InputError
from paritygate.records import Record

if TYPE_CHECKING:
    from torch import nn

    from paritygate.engines.dump_audit import DumpSummary
    from paritygate.engines.hf_routing import MoeLayout
    from paritygate.engines.rollout_dump import DumpRecord
    from paritygate.metrics.routing import LayerRouting
    from paritygate.result import Measurement


@dataclass(frozen=True)
class DumpAudited(Record):
    """How many of the dump's records carried their routing."""

    dump_records_audited: int


def dump_layers(
    m: Measurement, dump: DumpSummary, training: nn.Module, layout: MoeLayout,
    tie: float, *, pad_id: int, batch: int | None = None,
) -> list[LayerRouting] | None:
    """Per MoE layer, the dump's routing against the trainer's on the recorded positions,
    merged over batches of records (:func:`paritygate.engines.dump_audit.routed_batches`);
    ``None`` (with a note) when no record carries ``routed_experts``. A layer count other
    than the model's is bad input; another top-k is compared as such (every token differs)."""
    from paritygate.engines.dump_audit import routed_batches
    from paritygate.metrics.routing import merge_layers

    if not dump.routed.records:
        m.note("the dump's records carry no routed_experts: the engine's routing is not "
               "audited (set causal_lm.routing.dump_experts: true to require it)")
        return None
    if dump.routed.layers is not None and dump.routed.layers != len(layout.routers):
        raise InputError(dump.path, "routed_experts",
                         f"{dump.routed.layers} MoE layers per position; the model has "
                         f"{len(layout.routers)}")
    parts: list[list[LayerRouting]] = [[] for _ in layout.routers]
    top_k_noted = False
    for records in routed_batches(dump, batch=batch):
        layers, k = _batch_layers(records, training, layout, tie, pad_id)
        if k != layout.top_k and not top_k_noted:
            top_k_noted = True
            m.fail("top_k_differs", f"the dump's engine routed each token to {k} experts, "
                                    f"the trainer routes to {layout.top_k}")
        for li, layer in enumerate(layers):
            parts[li].append(layer)
    m.record(DumpAudited(dump.routed.records))
    return [merge_layers(p) for p in parts]


def _batch_layers(
    records: list[DumpRecord], training: nn.Module, layout: MoeLayout, tie: float, pad_id: int,
) -> tuple[list[LayerRouting], int]:
    """One batch: per MoE layer, the recorded experts against the trainer's on the same
    positions; with the engine's top-k."""
    import numpy as np

    from paritygate.engines.hf_routing import positions, routed_forward
    from paritygate.metrics.routing import compare_layer

    seqs = [r["prompt_ids"] + r["completion_ids"] for r in records]
    capture, mask = routed_forward(training, layout, seqs, pad_id)
    flat: list[int] = []
    recorded: list[list[list[int]]] = []
    for seq_pos, record in zip(positions(seqs), records, strict=True):
        routed = record["routed_experts"] or []
        flat += seq_pos[: len(routed)]
        recorded += routed
    engine = np.asarray(recorded, dtype=np.int64)  # (N, L, K)
    every = mask | ~mask  # all captured positions, padding included; ``flat`` indexes them
    out = []
    for li, router in enumerate(layout.routers):
        full = capture.layer(router, every)
        trainer = {k: v[flat] for k, v in full.items()}
        out.append(compare_layer(router, trainer,
                                 {"logits": None, "experts": engine[:, li, :], "weights": None},
                                 tie))
    return out, int(engine.shape[-1])
