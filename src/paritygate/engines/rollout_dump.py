"""Rollout dumps: any engine's sampled rollouts as a file the gate audits on CPU.

One record per sequence, in JSONL (one JSON object per line) or Parquet (one row per
sequence, same column names; needs pyarrow). Fields:

- ``prompt_ids`` (list of int, required, non-empty): the prompt token ids, each in
  ``[0, vocab_size)`` of the model (its ``config.json``).
- ``completion_ids`` (list of int, required): the generated token ids, in the same range.
- ``logprobs`` (list of float, required, same length as ``completion_ids``): the engine's
  log-prob of each generated token: finite and ``<= 0`` (a sampled token had a probability).
- ``sampling`` (object, optional): the sampling params of the request (``temperature``,
  ``top_p``, ``top_k``, ``min_p``, ``max_tokens``/``max_new_tokens``, ``stop``, ``seed``...).
  A record with ``temperature: 0`` (or ``do_sample: false``) is a greedy rollout;
  ``temperature`` is finite and ``>= 0``, ``top_p`` and ``min_p`` in ``[0, 1]``.
- ``top_logprobs`` (list, optional, same length as ``completion_ids``): per token a mapping
  token id -> log-prob (JSON object keys are strings of ints); ids in the vocabulary, values
  ``<= 0`` and not NaN (``-Infinity``: a token the processed distribution excludes).
- ``logprobs_mode`` (``raw`` | ``processed``, optional, default ``processed``).
- ``engine`` (string, optional): who wrote the dump (``vllm``, ``sglang``, ``hf``...).
- ``routed_experts`` (optional, a mixture-of-experts policy): per token position, per MoE
  layer, the ``top_k`` expert ids the engine routed it to (:mod:`.dump_routing`).

The JSON Schema of a record is published as ``schemas/rollout_dump.schema.json``
(:data:`DUMP_RECORD_SCHEMA`). A bad dump raises :class:`~paritygate.errors.InputError`
naming the line (1-based; the row for Parquet) and the field. The file is at most
:data:`~paritygate.reading.MAX_DUMP_BYTES` on disk, checked before it is read.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict

from paritygate.engines.dump_routing import ROUTED_EXPERTS_SCHEMA, validate_routed_experts
from paritygate.engines.generation import Generation, SamplingSpec
from paritygate.errors import InputError, MissingExtra
from paritygate.reading import MAX_DUMP_BYTES, check_input
from paritygate.reading_text import iter_json_lines

FIELDS = ("prompt_ids", "completion_ids", "logprobs", "sampling", "top_logprobs",
          "logprobs_mode", "engine", "routed_experts")
REQUIRED = ("prompt_ids", "completion_ids", "logprobs")


LOGPROB_SLACK = 1e-6
"""A log-prob may exceed 0 by this much (an engine's float rounding of log(1))."""

_TOKEN_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}}
_LOGPROB = {"type": "number", "maximum": LOGPROB_SLACK}

DUMP_RECORD_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "paritygate rollout dump record (one JSONL line or Parquet row)",
    "description": "Beyond what JSON Schema states: token ids are below the model's "
                   "config.json vocab_size, logprobs has one finite value per completion "
                   "token (no NaN or Infinity), top_logprobs one mapping per completion "
                   "token with values that are not NaN.",
    "type": "object",
    "additionalProperties": False,
    "required": ["prompt_ids", "completion_ids", "logprobs"],
    "properties": {
        "prompt_ids": {**_TOKEN_IDS, "minItems": 1},
        "completion_ids": _TOKEN_IDS,
        "logprobs": {"type": "array", "items": _LOGPROB},
        "sampling": {
            "type": ["object", "null"],
            "properties": {
                "temperature": {"type": ["number", "null"], "minimum": 0},
                "top_p": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
                "min_p": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
                "repetition_penalty": {"type": ["number", "null"], "minimum": 0},
                "top_k": {"type": ["integer", "null"]},
                "max_tokens": {"type": ["integer", "null"], "minimum": 0},
                "max_new_tokens": {"type": ["integer", "null"], "minimum": 0},
                "do_sample": {"type": ["boolean", "null"]},
            },
        },
        "top_logprobs": {
            "type": ["array", "null"],
            "items": {"anyOf": [
                {"type": "object", "patternProperties": {"^[0-9]+$": _LOGPROB},
                 "additionalProperties": False},
                {"type": "array", "items": {
                    "type": "object", "required": ["key", "value"],
                    "properties": {"key": {"type": "integer", "minimum": 0},
                                   "value": _LOGPROB}}},
            ]},
        },
        "logprobs_mode": {"enum": ["raw", "processed", None]},
        "engine": {"type": ["string", "null"]},
        "routed_experts": ROUTED_EXPERTS_SCHEMA,
    },
}
"""The published JSON Schema of one record (``schemas/rollout_dump.schema.json``);
:func:`validate_record` enforces it and the checks JSON Schema cannot state."""


def _int_list(path: Path, where: str, name: str, value: object, *, non_empty: bool,
              vocab_size: int | None) -> list[int]:
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
    ):
        raise InputError(path, f"{where}: {name}", "must be a list of non-negative token ids")
    if non_empty and not value:
        raise InputError(path, f"{where}: {name}", "must not be empty")
    _in_vocab(path, f"{where}: {name}", value, vocab_size)
    return [int(v) for v in value]


def _in_vocab(path: Path, key: str, ids: Sequence[int], vocab_size: int | None) -> None:
    if vocab_size is None or not ids:
        return
    worst = max(ids)
    if worst >= vocab_size:
        at = list(ids).index(worst)
        raise InputError(path, key, f"token id {worst} (position {at}) is outside the model's "
                                    f"vocabulary of {vocab_size} ids (config.json vocab_size)")


def _logprob_list(path: Path, key: str, values: object, count: int) -> list[float]:
    """Finite numbers ``<= 0`` (:data:`LOGPROB_SLACK` allowed), one per completion token."""
    if not isinstance(values, (list, tuple)) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in values
    ):
        raise InputError(path, key, "must be a list of numbers")
    if len(values) != count:
        raise InputError(path, key, f"{len(values)} log-probs for {count} completion tokens")
    out = [float(v) for v in values]
    for at, v in enumerate(out):
        if not math.isfinite(v):
            raise InputError(path, key, f"log-prob {v} at position {at}: a sampled token's "
                                        "log-prob is finite")
        if v > LOGPROB_SLACK:
            raise InputError(path, key, f"log-prob {v} at position {at}: a log-prob must be <= 0")
    return out


def _top_list(path: Path, key: str, top: object, count: int,
              vocab_size: int | None) -> list[dict[int, float]]:
    """One ``{token id: log-prob}`` per completion token: ids in the vocabulary, values
    ``<= 0`` and not NaN (``-inf`` is a token the processed distribution excludes)."""
    if not isinstance(top, (list, tuple)) or len(top) != count:
        raise InputError(path, key, "must be one mapping per completion token")
    try:
        steps = [
            {int(d["key"]): float(d["value"]) for d in step}
            if isinstance(step, (list, tuple))
            else {int(k): float(v) for k, v in dict(step).items()}
            for step in top
        ]
    except (TypeError, ValueError, KeyError):
        raise InputError(path, key, "each step must map token id -> log-prob") from None
    for at, step in enumerate(steps):
        if any(tid < 0 for tid in step):
            raise InputError(path, key, f"step {at}: a token id must be non-negative")
        _in_vocab(path, key, list(step), vocab_size)
        bad = [v for v in step.values() if math.isnan(v) or v > LOGPROB_SLACK]
        if bad:
            raise InputError(path, key, f"step {at}: log-prob {bad[0]} (must be <= 0, not NaN)")
    return steps


SAMPLING_RANGES: dict[str, tuple[float, float]] = {
    "temperature": (0.0, math.inf), "top_p": (0.0, 1.0), "min_p": (0.0, 1.0),
    "repetition_penalty": (0.0, math.inf),
}
"""The closed range of each numeric sampling param a dump record may hold (finite values)."""


def _check_sampling(path: Path, where: str, params: Mapping[str, object]) -> None:
    for name, (low, high) in SAMPLING_RANGES.items():
        value = params.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InputError(path, f"{where}: sampling.{name}", f"must be a number, got "
                                                               f"{type(value).__name__}")
        if not (math.isfinite(value) and low <= value <= high):
            shown = "no upper bound" if high == math.inf else f"at most {high}"
            raise InputError(path, f"{where}: sampling.{name}",
                             f"{value} is out of range (finite, at least {low}, {shown})")


class DumpRecord(TypedDict):
    """One validated dump record (:func:`validate_record`)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[dict[int, float]] | None
    sampling: SamplingSpec
    logprobs_mode: str
    engine: str
    routed_experts: list[list[list[int]]] | None


def validate_record(
    path: Path, where: str, rec: object, vocab_size: int | None = None,
    num_experts: int | None = None,
) -> DumpRecord:
    """One validated, normalised record; ``where`` is ``line N`` or ``row N``; token ids
    are checked against ``vocab_size`` and routed expert ids against ``num_experts`` when
    they are known."""
    if not isinstance(rec, dict):
        raise InputError(path, where, "a record must be an object")
    for key in rec:
        if key not in FIELDS:
            raise InputError(path, f"{where}: {key}", f"unknown field; known: {', '.join(FIELDS)}")
    for key in REQUIRED:
        if rec.get(key) is None:
            raise InputError(path, f"{where}: {key}", "required field missing")
    prompt = _int_list(path, where, "prompt_ids", rec["prompt_ids"], non_empty=True,
                       vocab_size=vocab_size)
    completion = _int_list(path, where, "completion_ids", rec["completion_ids"],
                           non_empty=False, vocab_size=vocab_size)
    lps = _logprob_list(path, f"{where}: logprobs", rec["logprobs"], len(completion))
    raw_top = rec.get("top_logprobs")
    top = None
    if raw_top is not None:
        top = _top_list(path, f"{where}: top_logprobs", raw_top, len(completion), vocab_size)
    sampling = rec.get("sampling") or {}
    if not isinstance(sampling, dict):
        raise InputError(path, f"{where}: sampling", "must be an object")
    _check_sampling(path, where, sampling)
    try:
        spec = sampling_spec(sampling)
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(path, f"{where}: sampling", f"invalid sampling params: {exc}") from None
    mode = rec.get("logprobs_mode") or "processed"
    if mode not in ("raw", "processed"):
        raise InputError(path, f"{where}: logprobs_mode", "must be 'raw' or 'processed'")
    routed = rec.get("routed_experts")
    if routed is not None:
        routed = validate_routed_experts(path, where, routed, len(prompt) + len(completion),
                                         num_experts)
    return {
        "prompt_ids": prompt, "completion_ids": completion, "logprobs": lps,
        "top_logprobs": top, "sampling": spec, "logprobs_mode": mode,
        "engine": str(rec.get("engine") or "dump"), "routed_experts": routed,
    }


def sampling_spec(params: Mapping[str, object]) -> SamplingSpec:
    """A dump record's sampling params as a :class:`SamplingSpec` (vLLM or HF names)."""
    known = {
        "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_tokens",
        "max_new_tokens", "min_tokens", "min_new_tokens", "stop", "stop_strings", "seed",
        "do_sample",
    }
    ignored = {
        "n", "logprobs", "prompt_logprobs", "presence_penalty", "frequency_penalty",
        "stop_token_ids", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
        "include_stop_str_in_output", "best_of", "logit_bias", "detokenize", "output_kind",
    }
    for key in params:
        if key not in known | ignored:
            raise KeyError(f"unknown sampling param {key!r}")
    return SamplingSpec.from_dict({k: v for k, v in params.items() if k in known})


def _parquet_rows(path: Path) -> Iterator[tuple[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise MissingExtra("pyarrow", "lm") from None
    try:
        reader = pq.ParquetFile(path)
        meta = reader.metadata  # footer only: sizes as the file declares
        declared = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    except Exception as exc:  # pyarrow raises many types for a bad file
        raise InputError(path, None, f"unreadable Parquet dump: {exc}") from None
    if declared > MAX_DUMP_BYTES:
        raise InputError(path, None, f"Parquet dump declares {declared} bytes uncompressed, "
                                     f"more than the {MAX_DUMP_BYTES} bound (MAX_DUMP_BYTES); "
                                     "refused before decompressing it")
    row = 0
    try:
        for batch in reader.iter_batches(batch_size=ROWS_PER_READ):
            for rec in batch.to_pylist():
                row += 1
                yield f"row {row}", rec
    except InputError:
        raise
    except Exception as exc:  # pyarrow raises many types for a bad file
        raise InputError(path, None, f"unreadable Parquet dump: {exc}") from None


def _rows(path: Path) -> Iterator[tuple[str, Any]]:
    """The dump's records one at a time (``where``, decoded row): memory is one row (one
    Parquet batch of :data:`ROWS_PER_READ`), never the file."""
    if path.suffix == ".parquet":
        yield from _parquet_rows(path)
        return
    for n, row in iter_json_lines(path, None, what="rollout dump", max_bytes=MAX_DUMP_BYTES,
                                  bound="MAX_DUMP_BYTES"):
        yield f"line {n}", row


ROWS_PER_READ = 1024
"""Parquet rows decoded at a time while a dump streams."""


def iter_records(path: Path, *, vocab_size: int | None = None,
                 num_experts: int | None = None) -> Iterator[tuple[str, DumpRecord]]:
    """The validated records of a JSONL or Parquet dump, one at a time, in file order, each
    with where it is (``line N`` or ``row N``; token ids below ``vocab_size``, routed expert ids
    below ``num_experts``, when given). A FIFO, a device, a sparse file or one over
    :data:`~paritygate.reading.MAX_DUMP_BYTES` is refused before a byte is read."""
    check_input(path, None, what="rollout dump", max_bytes=MAX_DUMP_BYTES,
                bound="MAX_DUMP_BYTES")
    for where, row in _rows(path):
        if isinstance(row, dict):
            row = {k: v for k, v in row.items() if v is not None}
            if isinstance(row.get("sampling"), dict):
                row["sampling"] = {k: v for k, v in row["sampling"].items() if v is not None}
        yield where, validate_record(path, where, row, vocab_size, num_experts)


def read_dump(path: Path, *, vocab_size: int | None = None,
              num_experts: int | None = None) -> list[DumpRecord]:
    """Every validated record of a JSONL or Parquet dump (:func:`iter_records`), in memory:
    a dump's log-prob and greedy audits stream instead (:mod:`paritygate.engines.dump_audit`)."""
    records = [record for _, record in iter_records(path, vocab_size=vocab_size,
                                                    num_experts=num_experts)]
    if not records:
        raise InputError(path, None, "rollout dump holds no record")
    return records


def as_generation(records: Sequence[DumpRecord], engine: str = "dump") -> Generation:
    """Records as a :class:`Generation` (all must share one logprobs mode)."""
    modes = {r["logprobs_mode"] for r in records}
    if len(modes) > 1:
        raise ValueError(f"records mix log-prob modes {sorted(modes)}")
    tops = [r["top_logprobs"] for r in records]
    known = [t for t in tops if t is not None]
    return Generation(
        prompt_ids=[r["prompt_ids"] for r in records],
        output_ids=[r["completion_ids"] for r in records],
        logprobs=[r["logprobs"] for r in records],
        top_logprobs=known if len(known) == len(tops) else None,
        logprobs_mode=modes.pop(),
        engine=records[0]["engine"] if engine == "dump" else engine,
    )


def is_greedy(spec: SamplingSpec) -> bool:
    return not spec.do_sample or spec.temperature == 0.0


def dump_records(generation: Generation, sampling: SamplingSpec) -> list[dict[str, Any]]:
    """A generation as dump records (the schema above)."""
    params = {
        "temperature": 0.0 if not sampling.do_sample else sampling.temperature,
        "top_p": sampling.top_p, "top_k": sampling.top_k, "min_p": sampling.min_p,
        "repetition_penalty": sampling.repetition_penalty,
        "max_tokens": sampling.max_new_tokens, "min_tokens": sampling.min_new_tokens,
        "stop": list(sampling.stop), "seed": sampling.seed,
    }
    out = []
    for i, (prompt, ids, lps) in enumerate(
        zip(generation.prompt_ids, generation.output_ids, generation.logprobs, strict=True)
    ):
        rec: dict[str, Any] = {
            "prompt_ids": list(prompt), "completion_ids": list(ids),
            "logprobs": [float(v) for v in lps], "sampling": params,
            "logprobs_mode": generation.logprobs_mode, "engine": generation.engine,
        }
        if generation.top_logprobs is not None:
            rec["top_logprobs"] = [
                {str(k): float(v) for k, v in step.items()} for step in generation.top_logprobs[i]
            ]
        out.append(rec)
    return out


def write_dump(path: Path, records: list[dict[str, Any]]) -> Path:
    """Write records as JSONL, or Parquet when ``path`` ends in ``.parquet``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise MissingExtra("pyarrow", "lm") from None
        rows = [dict(r) for r in records]
        for r in rows:  # Parquet needs one schema: top-k as a list of {id, logprob} lists
            if "top_logprobs" in r:
                r["top_logprobs"] = [
                    [{"key": k, "value": v} for k, v in step.items()] for step in r["top_logprobs"]
                ]
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path
