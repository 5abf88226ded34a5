"""Sampled rollouts read from dumps in streaming batches, for ``behaviour_parity``.

A side's dump is one file, a glob or a list of files (the shards a distributed engine
writes: vLLM with tensor or data parallelism, SGLang), JSONL or Parquet, read one batch of
records at a time: memory is O(batch), never the whole dump. A record needs ``prompt_ids``,
``completion_ids`` and ``finish_reason`` (``eos``, ``stop`` or ``length``; vLLM's ``stop``
with a ``stop_reason`` that is a string is a stop string, with none or a token id it is the
EOS or a stop token id). Other fields of the rollout dump format are allowed and not read.
A record without a field the statistics need is bad input naming file, line and field.
"""

from __future__ import annotations

import glob
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from paritygate.errors import InputError, MissingExtra
from paritygate.reading import MAX_DUMP_BYTES, check_input
from paritygate.reading_text import iter_json_lines

FINISH_REASONS = ("eos", "stop", "length")


@dataclass(frozen=True)
class Draw:
    """One sampled completion: its prompt, its tokens and how it ended."""

    prompt_ids: tuple[int, ...]
    completion_ids: list[int]
    reason: str
    """One of ``eos``, ``stop`` (a stop string or stop token id), ``length``."""
    scored_prompt: tuple[int, ...] | None = None
    """The prompt the trainer scores the completion after, when not ``prompt_ids``: the
    training side's rendering of the same probe (another chat template shows here)."""


def expand(paths: str | Sequence[str], base: Path, key: str) -> list[Path]:
    """The shard files of a side: each entry a path or a glob, relative to ``base`` (the
    config's folder), in sorted order; a pattern matching nothing is bad input."""
    entries = [paths] if isinstance(paths, str) else list(paths)
    found: list[Path] = []
    for entry in entries:
        pattern = entry if Path(entry).is_absolute() else str(base / entry)
        matched = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        if not matched:
            raise InputError(base, key, f"{entry!r} matches no file")
        found.extend(Path(m) for m in matched)
    return found


def _ids(path: Path, where: str, rec: dict[str, object], name: str,
         vocab_size: int | None) -> list[int]:
    value = rec.get(name)
    if value is None:
        raise InputError(path, f"{where}: {name}",
                         "required field missing (behaviour_parity reads it)")
    if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        raise InputError(path, f"{where}: {name}", "must be a list of non-negative token ids")
    if vocab_size is not None and value and max(value) >= vocab_size:
        raise InputError(path, f"{where}: {name}", f"token id {max(value)} is outside the "
                                                   f"model's vocabulary of {vocab_size} ids")
    return value


def finish_from_vllm(finish_reason: object, stop_reason: object) -> str:
    """vLLM's ``finish_reason`` / ``stop_reason`` as a stop reason: ``length`` is the length
    limit; ``stop`` with a string ``stop_reason`` a stop string, with a token id or none the
    EOS (or a stop token id, which the configs list as EOS ids)."""
    if finish_reason == "length":
        return "length"
    return "stop" if isinstance(stop_reason, str) else "eos"


def _reason(path: Path, where: str, rec: dict[str, object]) -> str:
    finish = rec.get("finish_reason")
    if finish is None:
        raise InputError(path, f"{where}: finish_reason", "required field missing (the "
                         "stop-reason rates need eos, stop or length per record)")
    if finish == "stop" and "stop_reason" in rec:
        return finish_from_vllm(finish, rec["stop_reason"])
    if finish not in FINISH_REASONS:
        raise InputError(path, f"{where}: finish_reason",
                         f"{finish!r} is not one of {', '.join(FINISH_REASONS)}")
    return str(finish)


def to_draw(path: Path, where: str, rec: object, vocab_size: int | None) -> Draw:
    """One record as a :class:`Draw`, or bad input naming file, line and field."""
    if not isinstance(rec, dict):
        raise InputError(path, where, "a record must be an object")
    prompt = _ids(path, where, rec, "prompt_ids", vocab_size)
    if not prompt:
        raise InputError(path, f"{where}: prompt_ids", "must not be empty")
    completion = _ids(path, where, rec, "completion_ids", vocab_size)
    return Draw(tuple(prompt), completion, _reason(path, where, rec))


def _records(path: Path) -> Iterator[tuple[str, object]]:
    check_input(path, None, what="rollout dump", max_bytes=MAX_DUMP_BYTES, bound="MAX_DUMP_BYTES")
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise MissingExtra("pyarrow", "lm") from None
        try:
            reader = pq.ParquetFile(path)
            row = 0
            for batch in reader.iter_batches(batch_size=1024):
                for rec in batch.to_pylist():
                    row += 1
                    yield f"row {row}", rec
        except (OSError, ValueError) as exc:
            raise InputError(path, None, f"unreadable Parquet dump: {exc}") from None
        return
    for n, rec in iter_json_lines(path, None, what="rollout dump"):
        yield f"line {n}", rec


def stream_draws(paths: Sequence[Path], *, batch: int,
                 vocab_size: int | None = None) -> Iterator[list[Draw]]:
    """The shards' records as batches of at most ``batch`` draws, file after file."""
    pending: list[Draw] = []
    seen = False
    for path in paths:
        for where, rec in _records(path):
            seen = True
            pending.append(to_draw(path, where, rec, vocab_size))
            if len(pending) >= batch:
                yield pending
                pending = []
    if pending:
        yield pending
    if not seen:
        raise InputError(paths[0] if paths else None, None, "rollout dump holds no record")
