"""A rollout dump's audit in memory that does not grow with the dump: one validating pass
counts its greedy and sampled records and tokens (:func:`summarise_dump`, run when the gate's
context is built, before any model loads), then each check reads the records again in batches
(:func:`dump_batches`, :func:`routed_batches`), so ``logprob_delta``, ``generation_parity`` and
``routing_agreement`` hold one batch at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from paritygate.engines.generation import Generation, SamplingSpec
from paritygate.engines.rollout_dump import DumpRecord, as_generation, is_greedy, iter_records
from paritygate.errors import InputError

DUMP_BATCH = 256
"""Records a dump's audit holds at a time."""


@dataclass(frozen=True)
class DumpPart:
    """The greedy or the sampled records of a dump, as its validation pass counted them."""

    records: int = 0
    tokens: int = 0
    """Completion tokens, summed over the records."""
    sampling: SamplingSpec | None = None
    """The first record's sampling params (the ones ``logprob_delta`` names)."""
    mode: str | None = None
    """The records' log-prob mode (one per part: a mix is bad input)."""


@dataclass(frozen=True)
class RoutedPart:
    """The records that carry ``routed_experts`` (a mixture-of-experts engine's routing)."""

    records: int = 0
    layers: int | None = None
    """MoE layers per position, one count throughout the dump (checked)."""
    first_missing: str | None = None
    """Where the first record without the field is (``line N``), if any."""


@dataclass(frozen=True)
class DumpSummary:
    """A validated dump: its path, the vocabulary it was checked against and its parts. The
    records themselves are read again, batch by batch, by :func:`dump_batches`."""

    path: Path
    vocab_size: int | None
    greedy: DumpPart
    sampled: DumpPart
    num_experts: int | None = None
    """The experts per MoE layer routed expert ids were checked against (``None``: dense)."""
    routed: RoutedPart = RoutedPart()


def summarise_dump(path: Path, *, vocab_size: int | None = None,
                   num_experts: int | None = None) -> DumpSummary:
    """Validate every record of the dump in one streaming pass (memory: one record) and count
    its greedy and sampled parts; bad input names the line and field."""
    parts: dict[bool, DumpPart] = {True: DumpPart(), False: DumpPart()}
    routed = RoutedPart()
    seen = False
    for where, record in iter_records(path, vocab_size=vocab_size, num_experts=num_experts):
        seen = True
        routed = _count_routed(path, where, record, routed)
        greedy = is_greedy(record["sampling"])
        part = parts[greedy]
        if part.mode is not None and record["logprobs_mode"] != part.mode:
            which = "greedy" if greedy else "sampled"
            raise InputError(path, f"{where}: logprobs_mode",
                             f"{record['logprobs_mode']!r}, but the {which} records before it "
                             f"are {part.mode!r}: one dump, one log-prob mode per part")
        parts[greedy] = DumpPart(
            records=part.records + 1, tokens=part.tokens + len(record["completion_ids"]),
            sampling=part.sampling or record["sampling"], mode=record["logprobs_mode"])
    if not seen:
        raise InputError(path, None, "rollout dump holds no record")
    return DumpSummary(path, vocab_size, greedy=parts[True], sampled=parts[False],
                       num_experts=num_experts, routed=routed)


def _count_routed(path: Path, where: str, record: DumpRecord, part: RoutedPart) -> RoutedPart:
    routed = record["routed_experts"]
    if routed is None:
        return part if part.first_missing else RoutedPart(part.records, part.layers, where)
    layers = len(routed[0]) if routed else part.layers
    if part.layers is not None and layers is not None and layers != part.layers:
        raise InputError(path, f"{where}: routed_experts",
                         f"{layers} MoE layers per position; the records before it have "
                         f"{part.layers}")
    return RoutedPart(part.records + 1, part.layers or layers, part.first_missing)


def dump_batches(summary: DumpSummary, *, greedy: bool,
                 batch: int | None = None) -> Iterator[Generation]:
    """The dump's greedy (or sampled) records as :class:`Generation` batches of at most
    ``batch`` records (default :data:`DUMP_BATCH`), in file order, read again from the file
    (memory: one batch)."""
    size = batch or DUMP_BATCH
    pending: list[DumpRecord] = []
    for _, record in iter_records(summary.path, vocab_size=summary.vocab_size):
        if is_greedy(record["sampling"]) != greedy:
            continue
        pending.append(record)
        if len(pending) >= size:
            yield as_generation(pending)
            pending = []
    if pending:
        yield as_generation(pending)


def routed_batches(summary: DumpSummary, *, batch: int | None = None,
                   ) -> Iterator[list[DumpRecord]]:
    """The dump's records that carry ``routed_experts``, greedy and sampled alike, in batches
    of at most ``batch`` (default :data:`DUMP_BATCH`), in file order (memory: one batch)."""
    size = batch or DUMP_BATCH
    pending: list[DumpRecord] = []
    for _, record in iter_records(summary.path, vocab_size=summary.vocab_size,
                                  num_experts=summary.num_experts):
        if record["routed_experts"] is None:
            continue
        pending.append(record)
        if len(pending) >= size:
            yield pending
            pending = []
    if pending:
        yield pending
