"""Golden baselines: the whole life cycle of a check's baseline, in one place.

``<golden_dir>/<name>/<check_id>.json`` holds ``{"metrics": {...}, "noise": {...},
"provenance": {...}}`` (``noise``: each metric's noise floor and its source, see
:mod:`paritygate.regression`; a baseline without it still loads); per-item metrics (one per
layer, :attr:`~paritygate.result.Metric.detail`) sit beside it in ``<check_id>.detail.json`` as
``{"metrics": {...}, "noise": {...}}``.
:func:`regression_check` owns the cycle: load the baseline, judge the measurement
against thresholds and golden (:func:`paritygate.verdict.judge`, which also fails a
baseline blessed on another probe set), then either bless (``--update-golden``, atomic, passing
checks only) or, when a baseline is missing or a metric regressed, write the obtained
metrics beside it as ``<check_id>.obtained.json`` with the command that blesses them.
A bless run is one transaction of :class:`GoldenStore` under the lock file
``.<name>.bless.lock`` beside the baseline folder.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from paritygate.files import FileLock, LockHeld, atomic_write_many, atomic_write_text, dump_json
from paritygate.records import Record
from paritygate.regression import NoiseEntry, blessed_noise, stored_noise
from paritygate.result import CheckResult, Measurement
from paritygate.verdict import GoldenRecord, GoldenValue, Margin, judge


@dataclass(frozen=True)
class Obtained(Record):
    """Where a failing check's obtained metrics were written, beside the golden file."""

    obtained_path: str


def _read_record(path: Path) -> GoldenRecord:
    """A golden JSON file with a ``metrics`` mapping of numbers, booleans or null; anything
    else is bad input naming the file and key (a string value would silently switch the
    metric's regression check off)."""
    from paritygate.errors import InputError
    from paritygate.reading import check_input, read_text
    from paritygate.reading_text import MAX_NESTING_DEPTH, nesting_depth

    check_input(path, None, what="golden file")
    text = read_text(path, "metrics", what="golden file")
    if nesting_depth(text.encode()) > MAX_NESTING_DEPTH:
        raise InputError(path, "metrics", f"golden file nests deeper than {MAX_NESTING_DEPTH} "
                                          "levels (MAX_NESTING_DEPTH)")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            path, f"line {exc.lineno}", f"golden file is not valid JSON: {exc.msg}"
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("metrics"), dict):
        raise InputError(path, "metrics", "golden file has no 'metrics' mapping")
    for name, value in data["metrics"].items():
        if value is not None and not isinstance(value, (int, float, bool)):
            raise InputError(path, f"metrics.{name}", f"golden value {value!r} is not a number")
    noise = data.get("noise")
    if noise is not None and not isinstance(noise, dict):
        raise InputError(path, "noise", "golden file's 'noise' is not a mapping")
    for name, entry in (noise or {}).items():
        if stored_noise(entry) is None:
            raise InputError(path, f"noise.{name}",
                             "a noise floor is {\"floor\": <number>, \"source\": <text>}")
    return cast(GoldenRecord, data)


class BlessInProgress(Exception):
    """Another run is blessing the same baseline folder."""

    def __init__(self, directory: Path, lock: Path, pid: int | None) -> None:
        holder = f"pid {pid}" if pid is not None else "another process"
        super().__init__(
            f"another run ({holder}) is blessing this baseline now (lock file {lock}); "
            "wait for it to finish, then bless again"
        )
        self.directory = directory
        self.lock = lock
        self.pid = pid


class GoldenStore:
    """Baselines of one gate (one config ``name``).

    A bless is a transaction (:meth:`begin`, :meth:`commit`, :meth:`discard`): the folder
    is locked for the whole run, blessed records are kept in memory and written together at
    the end, so an interrupted bless changes nothing and two blessers never mix one baseline.
    Outside a transaction :meth:`write` writes at once.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._lock = FileLock(directory.parent / f".{directory.name}.bless.lock")
        self._pending: dict[Path, str | None] | None = None

    @property
    def lock_path(self) -> Path:
        return self._lock.path

    def begin(self) -> None:
        """Lock the baseline folder and buffer blessed records until :meth:`commit`.

        Raises :class:`BlessInProgress` when another live run holds the lock, ``OSError``
        when the lock file cannot be created."""
        if self._pending is not None:
            return
        try:
            self._lock.acquire()
        except LockHeld as exc:
            raise BlessInProgress(self.directory, exc.path, exc.pid) from None
        self._pending = {}

    def commit(self) -> list[Path]:
        """Write the buffered records as one change (:func:`~paritygate.files.atomic_write_many`),
        then unlock; the lock is released either way."""
        pending, self._pending = self._pending or {}, None
        try:
            # staged together, then renamed: a write that fails changes no baseline file
            written = atomic_write_many(
                {path: text.encode("utf-8") for path, text in pending.items() if text is not None}
            )
            for path, text in pending.items():
                if text is None:
                    path.unlink(missing_ok=True)
        finally:
            self._lock.release()
        return written

    def discard(self) -> None:
        """Drop the buffered records (an interrupted or failed run) and unlock."""
        self._pending = None
        self._lock.release()

    def _put(self, path: Path, text: str | None) -> None:
        if self._pending is not None:
            self._pending.pop(path, None)  # keep write order: detail, record, obtained
            self._pending[path] = text
        elif text is None:
            path.unlink(missing_ok=True)
        else:
            atomic_write_text(path, text)

    def path(self, check_id: str) -> Path:
        return self.directory / f"{check_id}.json"

    def obtained_path(self, check_id: str) -> Path:
        return self.directory / f"{check_id}.obtained.json"

    def detail_path(self, check_id: str) -> Path:
        """Per-item baselines (a layer's error): kept apart from the headline metrics."""
        return self.directory / f"{check_id}.detail.json"

    def load(self, check_id: str) -> GoldenRecord | None:
        """The blessed record, or ``None`` when there is no baseline yet."""
        p = self.path(check_id)
        if not p.exists():
            return None
        data = _read_record(p)
        detail = self.detail_path(check_id)
        if detail.exists():
            items = _read_record(detail)
            data["detail_metrics"] = items.get("metrics", {})
            if "noise" in data:  # per-item floors beside per-item values
                data["noise"] = {**data["noise"], **items.get("noise", {})}
        return data

    def write(
        self,
        check_id: str,
        metrics: Mapping[str, GoldenValue],
        provenance: Mapping[str, object],
        detail: Mapping[str, GoldenValue] | None = None,
        noise: Mapping[str, NoiseEntry] | None = None,
    ) -> Path:
        """Bless ``metrics`` (and the per-item ``detail`` metrics, in their own file) as the
        new baseline with each metric's ``noise`` floor, and drop any stale obtained file."""
        p = self.path(check_id)
        record: dict[str, object] = {"metrics": metrics}
        items: dict[str, object] = {"metrics": detail}
        if noise is not None:  # None: no floors measured, judged by the default ones
            record["noise"] = {k: v for k, v in noise.items() if not (detail and k in detail)}
            items["noise"] = {k: v for k, v in noise.items() if detail and k in detail}
        record["provenance"] = provenance
        self._put(self.detail_path(check_id), dump_json(items) if detail else None)
        self._put(p, dump_json(record))
        self._put(self.obtained_path(check_id), None)
        return p

    def write_obtained(
        self,
        check_id: str,
        metrics: Mapping[str, GoldenValue],
        provenance: Mapping[str, object],
        detail: Mapping[str, GoldenValue] | None = None,
    ) -> Path:
        p = self.obtained_path(check_id)
        record: dict[str, object] = {"metrics": metrics, "provenance": provenance}
        if detail:
            record["detail_metrics"] = detail
        atomic_write_text(p, dump_json(record))
        return p


def regression_check(
    measurement: Measurement,
    store: GoldenStore,
    *,
    margin: Margin,
    blessing: bool,
    probes_sha256: Callable[[], str],
    provenance: Callable[[], Mapping[str, object]],
    bless_command: str,
    numerics: Callable[[], Mapping[str, object]] | None = None,
) -> CheckResult:
    """Judge ``measurement`` against its baseline in ``store`` and run the golden life cycle.

    ``probes_sha256`` and ``provenance`` are called only when needed (they may hash files).
    """
    check_id = measurement.check_id
    expected = store.load(check_id)
    compared = expected is not None and not blessing and measurement.skipped is None
    result = judge(
        measurement, expected, margin=margin, blessing=blessing,
        probes_sha256=probes_sha256() if compared else None,
        numerics=numerics() if compared and numerics is not None else None,
    )
    if result.status not in ("pass", "fail"):
        return result
    ratcheted = {n: m.value for n, m in measurement.metrics.items() if m.ratchet and not m.detail}
    detail = {n: m.value for n, m in measurement.metrics.items() if m.ratchet and m.detail}
    if blessing:
        if result.status == "pass":
            floors = blessed_noise({n: m for n, m in measurement.metrics.items() if m.ratchet})
            path = store.write(check_id, ratcheted, provenance(), detail, floors)
            result.message += f" (golden blessed: {path.name})"
        else:
            result.message += " (not blessed: the check fails its thresholds)"
        return result
    against_golden = {"no_golden", "regression", "probe_set_changed"}
    if result.status == "fail" and (
        result.golden is None or any(r.kind in against_golden for r in result.reasons)
    ):
        path = store.write_obtained(check_id, ratcheted, provenance(), detail)
        result.record(Obtained(str(path)))
        result.message += f" Obtained metrics written to {path.name} beside the golden."
        # Only a missing baseline is a reason to bless; a run that fails against an existing
        # baseline (or its thresholds) is never offered for blessing.
        if expected is None and [r.kind for r in result.reasons] == ["no_golden"]:
            result.message += f" Bless with: {bless_command}"
            result.bless_hint = f"bless with: {bless_command}"
    return result
