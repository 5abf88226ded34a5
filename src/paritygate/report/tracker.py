"""Gate results as tracker files: a TensorBoard event file and a JSON-lines metrics file.

Any tracker reads one of the two: TensorBoard (and W&B's ``sync_tensorboard``) reads the
event file, everything else the JSON lines. The event file is written here without
TensorBoard or TensorFlow: TFRecord framing (length, masked CRC-32C, payload, masked CRC-32C)
around ``Event`` protocol buffers holding ``Summary.Value(tag, simple_value)``, encoded by hand
(five fields), so the core install writes it.
"""

from __future__ import annotations

import json
import math
import os
import socket
import struct
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["EventFileWriter", "append_jsonl", "report_scalars"]


def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        crc = n
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), the checksum of TFRecord framing."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _field_bytes(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _event(wall_time: float, step: int, *, version: str | None = None,
           scalars: Mapping[str, float] | None = None) -> bytes:
    """One serialised ``tensorflow.Event``."""
    out = b"\x09" + struct.pack("<d", wall_time) + b"\x10" + _varint(step)
    if version is not None:
        out += _field_bytes(3, version.encode())
    if scalars:
        values = b"".join(
            _field_bytes(1, _field_bytes(1, tag.encode()) + b"\x15" + struct.pack("<f", value))
            for tag, value in scalars.items()
        )
        out += _field_bytes(5, values)
    return out


class EventFileWriter:
    """Appends scalar events to one ``events.out.tfevents.*`` file in ``log_dir``."""

    def __init__(self, log_dir: str | Path) -> None:
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        now = time.time()
        self.path = self.log_dir / (
            f"events.out.tfevents.{int(now)}.{socket.gethostname()}.{os.getpid()}.paritygate")
        self._write(_event(now, 0, version="brain.Event:2"))

    def _write(self, record: bytes) -> None:
        header = struct.pack("<Q", len(record))
        with open(self.path, "ab") as handle:
            handle.write(header + struct.pack("<I", _masked(crc32c(header))) + record
                         + struct.pack("<I", _masked(crc32c(record))))

    def add_scalars(self, scalars: Mapping[str, float], step: int) -> None:
        """One event holding every finite scalar (NaN/Inf are left out: TensorBoard plots
        them as gaps anyway; the JSON lines keep them as null)."""
        finite = {k: float(v) for k, v in scalars.items() if math.isfinite(float(v))}
        if finite:
            self._write(_event(time.time(), int(step), scalars=finite))


def append_jsonl(path: str | Path, record: Mapping[str, Any]) -> None:
    """Append one JSON line (NaN/Inf as ``null``); the line is written whole, in one call."""
    clean = {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v)
        for k, v in record.items()
    }
    line = json.dumps(clean, sort_keys=True) + "\n"
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(line)


def report_scalars(report: Mapping[str, Any], prefix: str = "paritygate/") -> dict[str, float]:
    """The numbers of a report.json a tracker plots: ``passed`` (1/0), the counts, and each
    check's key metric and status (``<check>/passed``, ``<check>/<key metric>``)."""
    out: dict[str, float] = {f"{prefix}passed": 1.0 if report.get("status") == "pass" else 0.0}
    for name, value in (report.get("counts") or {}).items():
        out[f"{prefix}checks_{name}"] = float(value)
    for check in report.get("checks") or []:
        cid = check["id"]
        if check["status"] == "skip":
            continue
        out[f"{prefix}{cid}/passed"] = 1.0 if check["status"] == "pass" else 0.0
        key = check.get("key_metric")
        value = (check.get("metrics") or {}).get(key) if key else None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[f"{prefix}{cid}/{key}"] = float(value)
        elif isinstance(value, dict) and value.get("nonfinite"):
            out[f"{prefix}{cid}/{key}"] = float(value["nonfinite"])
    return out
