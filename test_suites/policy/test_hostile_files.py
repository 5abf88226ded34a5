"""Hostile file sizes through the real CLI: refused from ``stat`` and headers, never read.

A 1.5 MB ``.npz`` whose member inflates to 1.5 GiB (a zip bomb), a 2 GiB sparse checkpoint
made by ``truncate``: each ends in exit 2 and one line naming the file and the key. The demo
policy is the clean subject: every other input is valid, and the policy context judges the
checkpoint's and the probe file's bounds from their headers. What the run did is measured by
the run itself (:mod:`measured_run`: bytes read, CPU seconds), never by the wall clock a loaded
machine stretches.
"""

from __future__ import annotations

import io
import os
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from measured_run import run_measured
from policy_zoo import base_config, merge

from paritygate.errors import InputError
from paritygate.reading import (
    MAX_ARRAY_BYTES,
    SPARSE_MIN_BYTES,
    check_input,
    hole_bytes,
    load_arrays,
)

CPU_BOUND_S = 60
"""A refusal costs the CLI's imports and a config load (a few CPU seconds)."""
READ_BOUND = 2**28
"""Bytes a refusal may read (imports and the config: tens of MB), far below the 1.5-2 GiB
these files hold or inflate to."""


def zip_bomb(path: Path, inflated: int, member: str = "obs.npy") -> Path:
    """A valid ``.npz`` whose one member (an ``.npy`` of float32 zeros) inflates to about
    ``inflated`` bytes (down to a whole float32). The deflate stream is one compressed block
    of 16 MiB of zeros repeated (each block ends in a full flush, so the blocks are
    independent), which builds a gigabyte bomb in about a second instead of deflating a
    gigabyte."""
    header = np.lib.format.header_data_from_array_1_0(np.zeros(0, np.float32))
    header["shape"] = (inflated // 4,)
    head_io = io.BytesIO()
    np.lib.format.write_array_header_1_0(head_io, header)  # its length: padded to 64 bytes
    header["shape"] = ((inflated - len(head_io.getvalue())) // 4,)
    head_io = io.BytesIO()
    np.lib.format.write_array_header_1_0(head_io, header)
    head = head_io.getvalue()
    inflated = len(head) + 4 * header["shape"][0]
    chunk = 1 << 24
    zeros = bytes(chunk)
    count, rest = divmod(inflated - len(head), chunk)
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    start = deflate.compress(head) + deflate.flush(zlib.Z_FULL_FLUSH)
    block = deflate.compress(zeros) + deflate.flush(zlib.Z_FULL_FLUSH)
    end = deflate.compress(bytes(rest)) + deflate.flush()
    data = start + block * count + end
    crc = zlib.crc32(head)
    for _ in range(count):
        crc = zlib.crc32(zeros, crc)
    crc = zlib.crc32(bytes(rest), crc)
    size = len(head) + count * chunk + rest
    assert size == inflated and size < 2**32  # no zip64 needed
    name = member.encode()
    local = struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, 8, 0, 33, crc, len(data), size,
                        len(name), 0) + name
    central = struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, 8, 0, 33, crc, len(data),
                          size, len(name), 0, 0, 0, 0, 0, 0) + name
    end_record = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 1, 1, len(central),
                             len(local) + len(data), 0)
    path.write_bytes(local + data + central + end_record)
    return path


def sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as fh:
        fh.truncate(size)  # holes only: nothing written
    return path


def run_cli(config: Path) -> tuple[int, str, str]:
    """``paritygate run CONFIG`` in a child, which must refuse unread: reading no more than
    :data:`READ_BOUND` bytes, within :data:`CPU_BOUND_S` CPU seconds."""
    run = run_measured(["run", str(config)], config.parent)
    assert 0 <= run.read_bytes < READ_BOUND, (run.read_bytes, run.err[-800:])
    assert run.cpu_s < CPU_BOUND_S, run.cpu_s
    return run.code, run.out, run.err


def one_line(code: int, out: str, err: str, *, file: Path, key: str) -> str:
    assert code == 2, f"exit {code}\nstdout: {out[-800:]}\nstderr: {err[-800:]}"
    assert "Traceback" not in out + err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("paritygate: error: "), err[-800:]
    assert str(file) in lines[0] and f": {key}: " in lines[0], lines[0]
    return lines[0]


def write_config(folder: Path, clean: Path, overrides: dict[str, Any]) -> Path:
    data = merge(base_config(clean), overrides)
    data["golden"] = {"dir": str(folder / "golden")}
    path = folder / "gate.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def test_zip_bomb_probes_are_refused_before_inflating(clean_demo: Path, tmp_path: Path) -> None:
    bomb = zip_bomb(tmp_path / "probes.npz", 3 * MAX_ARRAY_BYTES // 2)
    assert bomb.stat().st_size < 2 * 2**20  # 1.5 MB on disk
    probes = {"generator": None, "file": str(bomb)}
    cfg = write_config(tmp_path, clean_demo, {"policy": {"probes": probes}})
    line = one_line(*run_cli(cfg), file=bomb, key="policy.probes.file")
    assert "declares 1.50 GiB" in line and "MAX_ARRAY_BYTES" in line, line


def test_sparse_checkpoint_is_refused_without_reading(clean_demo: Path, tmp_path: Path) -> None:
    ckpt = sparse(tmp_path / "policy.safetensors", 2 * 2**30)
    cfg = write_config(tmp_path, clean_demo, {"policy": {"checkpoint": str(ckpt)}})
    line = one_line(*run_cli(cfg), file=ckpt, key="policy.checkpoint")
    assert "sparse file" in line, line


# --- the reader gate itself ----------------------------------------------------------------------


def test_npy_header_declaring_terabytes_is_refused(tmp_path: Path) -> None:
    """A small file whose array header declares 2^40 float32 values never reaches np.load."""
    path = tmp_path / "h0.npy"
    header = np.lib.format.header_data_from_array_1_0(np.zeros(0, np.float32))
    header["shape"] = (2**40,)
    with open(path, "wb") as fh:
        np.lib.format.write_array_header_1_0(fh, header)
        fh.write(bytes(64))
    with pytest.raises(InputError) as err:
        load_arrays(path, "policy.recurrent.states[0].initial", what="initial state")
    assert err.value.key == "policy.recurrent.states[0].initial"
    assert "declares 4096.00 GiB" in err.value.cause


def test_npz_within_bounds_loads(tmp_path: Path) -> None:
    path = tmp_path / "probes.npz"
    np.savez_compressed(path, obs=np.ones((4, 8), np.float32))
    loaded = load_arrays(path, "policy.probes.file")
    assert set(loaded) == {"obs"} and loaded["obs"].shape == (4, 8)


def test_sparse_below_the_size_floor_is_read_and_above_it_refused(tmp_path: Path) -> None:
    small = sparse(tmp_path / "small.bin", SPARSE_MIN_BYTES - 1)
    assert check_input(small, None) == small
    big = sparse(tmp_path / "big.bin", SPARSE_MIN_BYTES * 2)
    assert hole_bytes(big, big.stat()) == SPARSE_MIN_BYTES * 2
    with pytest.raises(InputError, match="sparse file"):
        check_input(big, "k")


def test_written_file_is_not_sparse(tmp_path: Path) -> None:
    path = tmp_path / "dense.bin"
    with open(path, "wb") as fh:
        for _ in range(SPARSE_MIN_BYTES // 2**20 + 1):
            fh.write(os.urandom(2**20))
    assert hole_bytes(path, path.stat()) == 0
    assert check_input(path, None) == path


def test_directory_holding_a_fifo_is_refused(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    os.mkfifo(model / "tokenizer.json")
    with pytest.raises(InputError) as err:
        check_input(model, "causal_lm.tokenizer.serving", what="tokenizer directory",
                    expect="dir")
    assert err.value.file == str(model / "tokenizer.json")
    assert "FIFO" in err.value.cause


def test_sb3_zip_whose_policy_member_is_a_bomb(clean_demo: Path, tmp_path: Path) -> None:
    """An SB3 ``.zip`` checkpoint whose ``policy.pth`` declares 1.5 GiB from 1.5 MB is refused
    by the member's declared size and ratio (``MAX_ZIP_RATIO``), never inflated."""
    ckpt = zip_bomb(tmp_path / "ppo.zip", 3 * 2**30 // 2, member="policy.pth")
    cfg = write_config(tmp_path, clean_demo, {"policy": {"checkpoint": str(ckpt)}})
    line = one_line(*run_cli(cfg), file=ckpt, key="policy.checkpoint")
    assert "zip bomb" in line and "policy.pth" in line, line
