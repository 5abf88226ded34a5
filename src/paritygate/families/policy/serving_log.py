"""Serving logs: what the serving path received and returned, read in bounded chunks.

Schema (README, "Serving-log replay"). A record holds ``obs`` (the raw observation: an array
of the probes' per-row shape, or an object keyed by observation input), ``served`` (what the
serving path returned: its first output, or the action taken), and optionally ``preprocessed``
(the model inputs serving computed, shaped like ``obs``) and ``timestamp`` (a number or a
string). JSON lines: one object per line. Parquet: the columns ``obs`` (or ``obs.<input>``),
``served``, ``preprocessed`` (or ``preprocessed.<input>``) and ``timestamp``, an array field a
(nested) list column; read a record batch of ``chunk`` rows at a time. ``.npz``: arrays
``obs`` (or ``obs.<input>``), ``served``, ``preprocessed`` (or ``preprocessed.<input>``),
``timestamp``, each with one row per record, read from the archive a chunk of rows at a
time, never whole.

A record that does not fit is bad input naming the file, the line (JSON lines), the row
(Parquet, 0-based) or the array (``.npz``) and the field.
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from paritygate.errors import InputError
from paritygate.reading_text import iter_json_lines

Row = tuple[int, dict[str, Any]]
"""A JSON-lines record and its line number."""


@dataclass
class Chunk:
    """Consecutive records: ``first`` is the 0-based index of the first; ``lines`` the JSON
    line of each (``None`` for ``.npz``)."""

    first: int
    lines: list[int] | None
    obs: dict[str, np.ndarray]
    served: np.ndarray
    preprocessed: dict[str, np.ndarray] | None
    """Rows where a record gave none are NaN; ``None`` when no record of the chunk gave any."""
    timestamps: list[Any]

    def __len__(self) -> int:
        return len(self.served)

    def where(self, i: int) -> str:
        """Where record ``i`` of the chunk sits in the file."""
        return f"line {self.lines[i]}" if self.lines is not None else f"record {self.first + i}"


@dataclass(frozen=True)
class Layout:
    """What a record must hold: each observation input's per-row shape and the served one."""

    inputs: Mapping[str, tuple[int, ...]]
    served: tuple[int, ...]
    served_integer: bool = False


def read_chunks(path: Path, layout: Layout, chunk: int, max_records: int) -> Iterator[Chunk]:
    """The log's records, ``chunk`` at a time; more than ``max_records`` is bad input."""
    if not path.is_file():
        raise InputError(path, None, "serving log not found")
    if path.suffix == ".npz":
        yield from _npz_chunks(path, layout, chunk, max_records)
    elif path.suffix in (".jsonl", ".json", ".ndjson"):
        yield from _jsonl_chunks(path, layout, chunk, max_records)
    elif path.suffix in (".parquet", ".pq"):
        yield from _parquet_chunks(path, layout, chunk, max_records)
    else:
        raise InputError(path, None, "a serving log is an .npz, a Parquet (.parquet) or a "
                         "JSON-lines (.jsonl) file")


# --- JSON lines -----------------------------------------------------------------------------


def _array(value: Any, shape: tuple[int, ...], where: str, path: Path, *, integer: bool = False
           ) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(path, where, "not a number or an array of numbers") from None
    if arr.ndim == 0 and shape == (1,):
        arr = arr.reshape(1)
    if tuple(arr.shape) != shape:
        raise InputError(path, where, f"shape {list(arr.shape)}, expected {list(shape)}")
    if integer and not np.all(np.isfinite(arr) & (arr == np.round(arr))):
        raise InputError(path, where, "a discrete action must be an integer")
    return arr


def _observations(value: Any, layout: Layout, field: str, where: str, path: Path
                  ) -> dict[str, np.ndarray]:
    names = list(layout.inputs)
    if len(names) == 1 and not isinstance(value, Mapping):
        return {names[0]: _array(value, layout.inputs[names[0]], f"{where}.{field}", path)}
    if not isinstance(value, Mapping):
        raise InputError(path, f"{where}.{field}", f"an object with the keys {names}")
    missing = [n for n in names if n not in value]
    if missing:
        raise InputError(path, f"{where}.{field}.{missing[0]}", "missing")
    return {n: _array(value[n], layout.inputs[n], f"{where}.{field}.{n}", path) for n in names}


def _jsonl_records(path: Path, max_records: int) -> Iterator[Row]:
    """``(line, record)`` of each record, its fields checked; past ``max_records``: bad input."""
    for count, (number, record) in enumerate(iter_json_lines(path, None, what="serving log"), 1):
        where = f"line {number}"
        if not isinstance(record, dict):
            raise InputError(path, where, "a record is a JSON object")
        for field in ("obs", "served"):
            if field not in record:
                raise InputError(path, f"{where}.{field}", "missing")
        stamp = record.get("timestamp")
        if stamp is not None and not isinstance(stamp, (int, float, str)):
            raise InputError(path, f"{where}.timestamp", "a number or a string")
        if count > max_records:
            raise InputError(path, "policy.serving_log.max_records",
                             f"more than {max_records} records: raise the bound or "
                             "replay a sample")
        yield number, record


def scan_serving_log(path: Path, max_records: int) -> None:
    """A JSON-lines log's every line read and its record checked, one line held at a time,
    before any model loads: a bad last line of a long log is refused in seconds."""
    if path.suffix in (".jsonl", ".json", ".ndjson"):
        for _ in _jsonl_records(path, max_records):
            pass


def _jsonl_chunks(path: Path, layout: Layout, chunk: int, max_records: int) -> Iterator[Chunk]:
    rows: list[Row] = []
    count = 0
    for row in _jsonl_records(path, max_records):
        count += 1
        rows.append(row)
        if len(rows) == chunk:
            yield _stack(rows, count - len(rows), layout, path)
            rows = []
    if rows:
        yield _stack(rows, count - len(rows), layout, path)


def _column(rows: Sequence[Row], field: str, name: str | None,
            shape: tuple[int, ...], path: Path, *, integer: bool = False) -> np.ndarray:
    """One field of every record as an (n, *shape) array, converted in one step; when that
    fails, record by record, so the first bad record is named."""
    values = [r[field] if name is None else r[field][name] for _, r in rows]
    try:
        arr = np.asarray(values, dtype=np.float64)
        if shape == (1,) and arr.ndim == 1:
            arr = arr[:, None]
        ok = arr.shape == (len(rows), *shape) and (
            not integer or bool(np.all(np.isfinite(arr) & (arr == np.round(arr)))))
    except (TypeError, ValueError):
        ok = False
    if ok:
        return arr
    label = field if name is None else f"{field}.{name}"
    for (number, _), value in zip(rows, values, strict=True):
        _array(value, shape, f"line {number}.{label}", path, integer=integer)
    raise AssertionError("unreachable: a record failed to convert")  # pragma: no cover


def _stack(rows: Sequence[Row], first: int, layout: Layout, path: Path
           ) -> Chunk:
    names = list(layout.inputs)
    single = len(names) == 1

    def inputs(field: str, subset: Sequence[Row]) -> dict[str, np.ndarray]:
        if not single or any(isinstance(r[field], Mapping) for _, r in subset):
            for number, r in subset:  # an object keyed by input: each key checked
                _observations(r[field], layout, field, f"line {number}", path)
            return {n: _column(subset, field, n, layout.inputs[n], path).astype(np.float32)
                    for n in names}
        return {names[0]: _column(subset, field, None, layout.inputs[names[0]], path
                                  ).astype(np.float32)}

    obs = inputs("obs", rows)
    served = _column(rows, "served", None, layout.served, path, integer=layout.served_integer)
    pre: dict[str, np.ndarray] | None = None
    given = [i for i, (_, r) in enumerate(rows) if r.get("preprocessed") is not None]
    if given:
        values = inputs("preprocessed", [rows[i] for i in given])
        pre = {n: np.full((len(rows), *layout.inputs[n]), np.nan, np.float32) for n in names}
        for n in names:
            pre[n][given] = values[n]
    return Chunk(first=first, lines=[number for number, _ in rows], obs=obs, served=served,
                 preprocessed=pre, timestamps=[r.get("timestamp") for _, r in rows])


# --- .npz -----------------------------------------------------------------------------------


class _Member:
    """One ``.npy`` array inside an ``.npz``, read row block by row block."""

    def __init__(self, archive: zipfile.ZipFile, name: str, path: Path) -> None:
        self.name = name.removesuffix(".npy")
        self.handle: IO[bytes] = archive.open(name)
        try:
            version = np.lib.format.read_magic(self.handle)
            header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                      else np.lib.format.read_array_header_2_0)
            shape, fortran, dtype = header(self.handle)
        except ValueError as exc:
            raise InputError(path, self.name, f"not an .npy array: {exc}") from None
        if dtype.hasobject or fortran or not shape:
            raise InputError(path, self.name, "an array of numbers, C order, one row a record")
        self.shape, self.dtype = tuple(shape), dtype
        self.row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize

    def rows(self, n: int) -> np.ndarray:
        data = self.handle.read(n * self.row_bytes)
        return np.frombuffer(data, self.dtype).reshape(-1, *self.shape[1:])


def _npz_chunks(path: Path, layout: Layout, chunk: int, max_records: int) -> Iterator[Chunk]:
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as exc:
        raise InputError(path, None, f"not an .npz archive: {exc}") from None
    with archive:
        names = {n.removesuffix(".npy"): n for n in archive.namelist()}
        single = len(layout.inputs) == 1

        def key(field: str, name: str) -> str:
            return field if single and field in names else f"{field}.{name}"

        want = {f"obs:{n}": key("obs", n) for n in layout.inputs}
        want["served"] = "served"
        for name in list(want.values()):
            if name not in names:
                raise InputError(path, name, "missing array")
        for n in layout.inputs:
            if key("preprocessed", n) in names:
                want[f"pre:{n}"] = key("preprocessed", n)
        if "timestamp" in names:
            want["timestamp"] = "timestamp"
        members = {label: _Member(archive, names[name], path) for label, name in want.items()}
        total = members["served"].shape[0]
        if total > max_records:
            raise InputError(path, "policy.serving_log.max_records",
                             f"{total} records, more than {max_records}: raise the bound or "
                             "replay a sample")
        for label, member in members.items():
            expected = (layout.served if label == "served" else () if label == "timestamp"
                        else layout.inputs[label.split(":", 1)[1]])
            got = member.shape[1:]
            if label == "served" and got == () and expected == (1,):
                got = (1,)
            if member.shape[0] != total or tuple(got) != tuple(expected):
                raise InputError(path, member.name, f"shape {list(member.shape)}, expected "
                                 f"{[total, *expected]} (one row per record)")
        for first in range(0, total, chunk):
            size = min(chunk, total - first)
            block = {label: m.rows(size) for label, m in members.items()}
            served = block["served"].astype(np.float64).reshape(size, *layout.served)
            if layout.served_integer:
                flat = served.reshape(size, -1)
                wrong = ~(np.isfinite(flat) & (flat == np.round(flat))).all(1)
                if wrong.any():
                    raise InputError(path, f"served[{first + int(np.argmax(wrong))}]",
                                     "a discrete action must be an integer")
            pre = {name: block[f"pre:{name}"].astype(np.float32) for name in layout.inputs
                   if f"pre:{name}" in block} or None
            stamps = block["timestamp"].tolist() if "timestamp" in block else [None] * size
            yield Chunk(first=first, lines=None,
                        obs={name: block[f"obs:{name}"].astype(np.float32)
                             for name in layout.inputs},
                        served=served, preprocessed=pre, timestamps=stamps)


# --- Parquet --------------------------------------------------------------------------------


def _parquet_column(column: object, shape: tuple[int, ...], first: int, field: str, path: Path,
                    *, integer: bool = False) -> np.ndarray:
    """One Parquet column of a record batch as an (n, *shape) float64 array: a number column
    for a per-row shape of ``(1,)`` or ``()``, else a list column nested once per axis."""
    import pyarrow as pa
    import pyarrow.compute as pc

    col = column
    assert isinstance(col, pa.Array)
    rows = len(col)

    def bad(index: int, cause: str) -> InputError:
        return InputError(path, f"row {first + index}.{field}", cause)

    def is_list(t: object) -> bool:
        return bool(pa.types.is_list(t) or pa.types.is_large_list(t)
                    or pa.types.is_fixed_size_list(t))

    if col.null_count:
        raise bad(int(np.argmax(col.is_null().to_numpy(zero_copy_only=False))), "null")
    # a number column holds a one-value record; otherwise one list level per axis
    dims = [] if shape in ((), (1,)) and not is_list(col.type) else list(shape)
    per_record = 1
    for size in dims:
        if not is_list(col.type):
            raise bad(0, f"a list column of shape {list(shape)} per record, got {col.type}")
        lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
        wrong = np.nonzero(lengths != size)[0]
        if wrong.size:
            at = int(wrong[0]) // per_record
            raise bad(at, f"shape: a list of {int(lengths[wrong[0]])}, expected {size} "
                      f"(per record {list(shape)})")
        flat = col.flatten()
        if flat.null_count:
            at = int(np.argmax(flat.is_null().to_numpy(zero_copy_only=False)))
            raise bad(at // (per_record * size), "null inside the array")
        col, per_record = flat, per_record * size
    if not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)
            or pa.types.is_boolean(col.type)):
        raise bad(0, f"not numbers ({col.type})")
    arr = col.to_numpy(zero_copy_only=False).astype(np.float64).reshape(rows, *shape)
    if integer:
        wrong_rows = ~(np.isfinite(arr) & (arr == np.round(arr))).reshape(rows, -1).all(1)
        if wrong_rows.any():
            raise bad(int(np.argmax(wrong_rows)), "a discrete action must be an integer")
    return arr


def _parquet_stamps(column: object) -> list[Any]:
    import pyarrow as pa

    assert isinstance(column, pa.Array)
    if pa.types.is_timestamp(column.type) or pa.types.is_date(column.type):
        return [None if v is None else v.isoformat() for v in column.to_pylist()]
    return list(column.to_pylist())


def _parquet_chunks(path: Path, layout: Layout, chunk: int, max_records: int) -> Iterator[Chunk]:
    """Record batches of at most ``chunk`` rows, only the columns the replay reads."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        from paritygate.errors import MissingExtra

        raise MissingExtra("pyarrow", "lm") from None
    try:
        source = pq.ParquetFile(path)
    except Exception as exc:
        raise InputError(path, None, f"not a Parquet file: {type(exc).__name__}: {exc}") from None
    names = set(source.schema_arrow.names)
    single = len(layout.inputs) == 1

    def key(field: str, name: str) -> str:
        keyed = f"{field}.{name}"
        return field if single and (field in names or keyed not in names) else keyed

    want = {f"obs:{n}": key("obs", n) for n in layout.inputs}
    want["served"] = "served"
    for column in list(want.values()):
        if column not in names:
            raise InputError(path, column, f"missing column (the log has {sorted(names)})")
    want.update({f"pre:{n}": key("preprocessed", n) for n in layout.inputs
                 if key("preprocessed", n) in names})
    if "timestamp" in names:
        want["timestamp"] = "timestamp"
    total = source.metadata.num_rows
    if total > max_records:
        raise InputError(path, "policy.serving_log.max_records",
                         f"{total} records, more than {max_records}: raise the bound or "
                         "replay a sample")
    first = 0
    for batch in source.iter_batches(batch_size=chunk, columns=sorted(set(want.values()))):
        col = {label: batch.column(name) for label, name in want.items()}
        obs = {n: _parquet_column(col[f"obs:{n}"], layout.inputs[n], first, want[f"obs:{n}"],
                                  path).astype(np.float32) for n in layout.inputs}
        served = _parquet_column(col["served"], layout.served, first, "served", path,
                                 integer=layout.served_integer)
        pre = {n: _parquet_column(col[f"pre:{n}"], layout.inputs[n], first, want[f"pre:{n}"],
                                  path).astype(np.float32)
               for n in layout.inputs if f"pre:{n}" in col} or None
        stamps = (_parquet_stamps(col["timestamp"]) if "timestamp" in col
                  else [None] * batch.num_rows)
        yield Chunk(first=first, lines=None, obs=obs, served=served, preprocessed=pre,
                    timestamps=stamps)
        first += batch.num_rows
