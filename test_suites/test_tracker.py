"""Tracker files: the TensorBoard event file is valid TFRecord framing around Event protos
(checked here byte by byte; read back by tensorboard itself in test_callbacks_trl), the JSON
lines keep NaN as null, and a report's numbers become tracker scalars."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest

from paritygate.report.tracker import (
    EventFileWriter,
    _masked,
    append_jsonl,
    crc32c,
    report_scalars,
)


def test_crc32c_matches_the_standard_check_value() -> None:
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(b"") == 0


def _records(path: Path) -> list[bytes]:
    data, out, at = path.read_bytes(), [], 0
    while at < len(data):
        header = data[at:at + 8]
        (length,) = struct.unpack("<Q", header)
        assert struct.unpack("<I", data[at + 8:at + 12])[0] == _masked(crc32c(header))
        payload = data[at + 12:at + 12 + length]
        assert struct.unpack("<I", data[at + 12 + length:at + 16 + length])[0] == _masked(
            crc32c(payload))
        out.append(payload)
        at += 16 + length
    return out


def test_event_file_frames_each_event_and_drops_nonfinite(tmp_path: Path) -> None:
    writer = EventFileWriter(tmp_path)
    writer.add_scalars({"paritygate/passed": 1.0, "x/nan": math.nan}, step=7)
    writer.add_scalars({"x/nan": math.nan}, step=8)  # nothing finite: no event
    records = _records(writer.path)
    assert len(records) == 2
    assert b"brain.Event:2" in records[0]
    assert b"paritygate/passed" in records[1] and b"x/nan" not in records[1]
    assert records[1][9:11] == b"\x10\x07"  # field 2 (step) = 7 after the 9-byte wall time
    assert struct.pack("<f", 1.0) in records[1]
    assert writer.path.name.startswith("events.out.tfevents.")


def test_jsonl_lines_are_strict_json(tmp_path: Path) -> None:
    path = tmp_path / "m" / "metrics.jsonl"
    append_jsonl(path, {"step": 1, "v": math.nan})
    append_jsonl(path, {"step": 2, "v": 0.5})
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert rows == [{"step": 1, "v": None}, {"step": 2, "v": 0.5}]


def test_report_scalars_take_key_metrics_and_skip_skips() -> None:
    report = {
        "status": "fail",
        "counts": {"total": 3, "pass": 1, "fail": 1, "error": 0, "skip": 1},
        "checks": [
            {"id": "weights_load", "status": "pass", "key_metric": "missing_keys",
             "metrics": {"missing_keys": 0}},
            {"id": "logprob_delta", "status": "fail", "key_metric": "delta_max_abs",
             "metrics": {"delta_max_abs": {"value": None, "nonfinite": "inf"}}},
            {"id": "rollout_parity", "status": "skip", "key_metric": None, "metrics": {}},
        ],
    }
    scalars = report_scalars(report)
    assert scalars["paritygate/passed"] == 0.0
    assert scalars["paritygate/checks_fail"] == 1.0
    assert scalars["paritygate/weights_load/missing_keys"] == 0.0
    assert scalars["paritygate/logprob_delta/passed"] == 0.0
    assert scalars["paritygate/logprob_delta/delta_max_abs"] == math.inf
    assert not any(k.startswith("paritygate/rollout_parity") for k in scalars)


def test_tensorboard_reads_the_event_file(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    writer = EventFileWriter(tmp_path)
    for step in (2, 4):
        writer.add_scalars({"paritygate/passed": float(step == 4), "a/b": step / 10}, step)
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("paritygate/passed")] == [(2, 0.0),
                                                                               (4, 1.0)]
    assert [e.value for e in events.Scalars("a/b")] == pytest.approx([0.2, 0.4])
