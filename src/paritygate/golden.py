"""Golden baselines: the whole life cycle of a check's baseline, in one place.

``<golden_dir>/<name>/<check_id>.json`` holds ``{"metrics": {...}, "provenance": {...}}``;
per-item metrics (one per layer, :attr:`~paritygate.result.Metric.detail`) sit beside it in
``<check_id>.detail.json`` as ``{"metrics": {...}}``.
:func:`regression_check` owns the cycle: load the baseline, judge the measurement
against thresholds and golden (:func:`paritygate.verdict.judge`, which also fails a
baseline blessed on another probe set), then either bless (``--update-golden``, atomic, passing
checks only) or, when a baseline is missing or a metric regressed, write the obtained
metrics beside it as ``<check_id>.obtained.json`` with the command that blesses them.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from paritygate.result import CheckResult, Measurement
from paritygate.verdict import Margin, judge


def _umask_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


STALE_TMP_S = 60.0
"""A temp file older than this is a leftover of a killed writer: a live write takes
milliseconds, so a concurrent writer (pytest-xdist) is never raced."""


def clean_stale_temps(path: Path, *, older_than_s: float = STALE_TMP_S) -> list[Path]:
    """Remove ``.<name>.*.tmp`` leftovers of ``path`` that a killed writer left behind."""
    import time

    removed = []
    now = time.time()
    for tmp in path.parent.glob(f".{path.name}.*.tmp"):
        try:
            if now - tmp.stat().st_mtime > older_than_s:
                tmp.unlink()
                removed.append(tmp)
        except OSError:
            continue  # another writer finished or removed it
    return removed


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temp file and ``os.replace``.

    Safe under pytest-xdist: concurrent writers never leave a half-written file.
    Stale temp files of killed writers are removed first (:func:`clean_stale_temps`).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_temps(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, _umask_mode())  # mkstemp creates 0600; reports and golden are shared files
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Binary counterpart of :func:`atomic_write_text`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_temps(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, _umask_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def json_default(obj: Any) -> Any:
    """JSON for numpy scalars/arrays and paths that checks may leave in details."""
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, (set, tuple)):
        return list(obj)
    return str(obj)


def dump_json(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=True, allow_nan=True, default=json_default) + "\n"


def _read_record(path: Path) -> dict[str, Any]:
    """A golden JSON file with a ``metrics`` mapping of numbers, booleans or null; anything
    else is bad input naming the file and key (a string value would silently switch the
    metric's regression check off)."""
    from paritygate.errors import InputError

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(
            path, f"line {exc.lineno}", f"golden file is not valid JSON: {exc.msg}"
        ) from None
    except UnicodeDecodeError:
        raise InputError(path, "metrics", "golden file is not UTF-8 JSON") from None
    except OSError as exc:
        raise InputError(path, "metrics", f"golden file unreadable: {exc.strerror}") from None
    if not isinstance(data, dict) or not isinstance(data.get("metrics"), dict):
        raise InputError(path, "metrics", "golden file has no 'metrics' mapping")
    for name, value in data["metrics"].items():
        if value is not None and not isinstance(value, (int, float, bool)):
            raise InputError(path, f"metrics.{name}", f"golden value {value!r} is not a number")
    return data



class GoldenStore:
    """Baselines of one gate (one config ``name``)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, check_id: str) -> Path:
        return self.directory / f"{check_id}.json"

    def obtained_path(self, check_id: str) -> Path:
        return self.directory / f"{check_id}.obtained.json"

    def detail_path(self, check_id: str) -> Path:
        """Per-item baselines (a layer's error): kept apart from the headline metrics."""
        return self.directory / f"{check_id}.detail.json"

    def load(self, check_id: str) -> dict[str, Any] | None:
        """The blessed record, or ``None`` when there is no baseline yet."""
        p = self.path(check_id)
        if not p.exists():
            return None
        data = _read_record(p)
        detail = self.detail_path(check_id)
        if detail.exists():
            data["detail_metrics"] = _read_record(detail)["metrics"]
        return data

    def write(
        self,
        check_id: str,
        metrics: dict[str, Any],
        provenance: dict[str, Any],
        detail: dict[str, Any] | None = None,
    ) -> Path:
        """Bless ``metrics`` (and the per-item ``detail`` metrics, in their own file) as the
        new baseline and drop any stale obtained file."""
        p = self.path(check_id)
        if detail:
            atomic_write_text(self.detail_path(check_id), dump_json({"metrics": detail}))
        else:
            self.detail_path(check_id).unlink(missing_ok=True)
        atomic_write_text(p, dump_json({"metrics": metrics, "provenance": provenance}))
        self.obtained_path(check_id).unlink(missing_ok=True)
        return p

    def write_obtained(
        self,
        check_id: str,
        metrics: dict[str, Any],
        provenance: dict[str, Any],
        detail: dict[str, Any] | None = None,
    ) -> Path:
        p = self.obtained_path(check_id)
        record: dict[str, Any] = {"metrics": metrics, "provenance": provenance}
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
    provenance: Callable[[], dict[str, Any]],
    bless_command: str,
    numerics: Callable[[], dict[str, Any]] | None = None,
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
            path = store.write(check_id, ratcheted, provenance(), detail)
            result.message += f" (golden blessed: {path.name})"
        else:
            result.message += " (not blessed: the check fails its thresholds)"
        return result
    against_golden = {"no_golden", "regression", "probe_set_changed"}
    if result.status == "fail" and (
        result.golden is None or any(r.kind in against_golden for r in result.reasons)
    ):
        path = store.write_obtained(check_id, ratcheted, provenance(), detail)
        result.details["obtained_path"] = str(path)
        result.message += f" Obtained metrics written to {path.name} beside the golden."
        # Only a missing baseline is a reason to bless; a run that fails against an existing
        # baseline (or its thresholds) is never offered for blessing.
        if expected is None and [r.kind for r in result.reasons] == ["no_golden"]:
            result.message += f" Bless with: {bless_command}"
            result.fix = f"bless with: {bless_command}"
    return result
