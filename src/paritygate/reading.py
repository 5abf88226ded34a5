"""Files the gate reads: only regular files (directories where one is expected), of bounded size.

The ground floor every reader of a user path goes through (it imports only
:mod:`paritygate.errors`): a FIFO or a device never returns end-of-file, a link to ``/dev/zero``
grows without end, a sparse file is gigabytes of zeros from a few blocks, and a zip member
declares its own uncompressed size. Each is refused here from ``stat`` and headers alone,
before a byte of content is read, as bad input naming the file and the config key.
"""

from __future__ import annotations

import os
import stat
import zipfile
from pathlib import Path
from typing import Any, Literal

from paritygate.errors import InputError

MAX_CONFIG_BYTES = 4 * 2**20
"""A gate config is at most 4 MiB (a list of 10^5 seeds is 0.8 MB); parsing YAML costs
about a second per MiB, so a larger file could not be refused within the 10 s contract."""

MAX_ARRAY_BYTES = 2**30
"""A ``.npy`` / ``.npz`` input (probes, a recurrent initial state) holds at most 1 GiB of
array data, counted from the sizes its zip members and array headers declare before any is
read: 10^5 probe rows of 84x84x4 uint8 images are 0.28 GB, while a 1.5 MB zip bomb
declaring 3.4 GB is refused at once."""

MAX_DUMP_BYTES = 2**30
"""A rollout dump is at most 1 GiB on disk (it is parsed whole; 8,000 rollouts of 512
tokens with log-probs are ~80 MB of JSONL)."""

SPARSE_MIN_BYTES = 64 * 2**20
"""Files below this size are never judged sparse (a few holes in a small file are harmless)."""

SPARSE_MAX_HOLE_FRACTION = 0.5
"""A file of at least :data:`SPARSE_MIN_BYTES` whose holes (ranges never written, read back
as zeros) exceed this fraction of its size is refused: no checkpoint, probe set or dump is
written that way, while ``truncate -s 2G`` makes one from nothing."""

_MAX_EXTENTS = 4096
"""At most this many data extents are counted when a file is measured for holes."""

_MAX_ENTRIES = 10_000
"""A directory input has at most this many entries inspected for special files."""


def special_kind(mode: int) -> str | None:
    """What a ``stat`` mode names when it is neither a regular file nor a directory."""
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        return "not a regular file"
    return None


def _link_note(path: Path) -> str:
    target = os.path.realpath(path)
    return f" (a link to {target})" if target != os.path.abspath(path) else ""


def _gib(size: int) -> str:
    return f"{size / 2**30:.2f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"


def hole_bytes(path: Path, st: os.stat_result) -> int:
    """Bytes of ``path`` that are holes (never written), measured without reading content:
    the allocated block count first, then the data extents (``SEEK_DATA``/``SEEK_HOLE``)
    where blocks are few, so a file that is small on disk only because a compressing file
    system packed it is not taken for a sparse one. 0 for files below :data:`SPARSE_MIN_BYTES`."""
    size = st.st_size
    if size < SPARSE_MIN_BYTES:
        return 0
    allocated = getattr(st, "st_blocks", size // 512 + 1) * 512
    if allocated >= size * (1 - SPARSE_MAX_HOLE_FRACTION):
        return 0
    seek_data, seek_hole = getattr(os, "SEEK_DATA", None), getattr(os, "SEEK_HOLE", None)
    if seek_data is None or seek_hole is None:  # pragma: no cover - not Linux/BSD/macOS
        return size - allocated
    data = 0
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        offset = 0
        for _ in range(_MAX_EXTENTS):
            try:
                start = os.lseek(fd, offset, seek_data)
            except OSError:  # ENXIO: no data past offset
                break
            end = os.lseek(fd, start, seek_hole)
            data += end - start
            offset = end
            if offset >= size:
                break
        else:
            data += size - offset  # too many extents to count: the rest is taken as data
    except OSError:  # a file system without hole reporting: its blocks stand
        return size - allocated
    finally:
        os.close(fd)
    return max(0, size - data)


def check_input(
    path: str | Path,
    key: str | None,
    *,
    what: str = "input file",
    expect: Literal["file", "dir", "any"] = "file",
    max_bytes: int | None = None,
    bound: str | None = None,
) -> Path:
    """``path`` when it may be read as ``expect``; else :class:`InputError` naming it and ``key``.

    Symlinks are followed and the target judged. Refused: a missing path (``any``: allowed,
    nothing to read), a FIFO, device or socket, a directory where a file is expected and the
    reverse; for files, a size over ``max_bytes`` (``bound`` names the documented constant)
    and a sparse file (:func:`hole_bytes`). A directory's own entries are checked for
    special files too, since loaders read them by name (``config.json``, ``tokenizer.json``).
    """
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if expect == "any":
            return path
        raise InputError(path, key, f"{what} not found") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        if expect == "any":  # a config string that is no path (too long, not a name)
            return path
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise InputError(path, key, f"cannot read {what}: {why}") from None
    kind = special_kind(st.st_mode)
    if kind is not None:
        raise InputError(path, key, f"{what} is {kind}{_link_note(path)}; only regular files "
                                    "(directories where one is expected) are read")
    if stat.S_ISDIR(st.st_mode):
        if expect == "file":
            raise InputError(path, key, f"{what} is a directory, expected a file")
        if expect == "dir":
            _check_entries(path, key, what)
        return path
    if expect == "dir":
        raise InputError(path, key, f"{what} is a file, expected a directory")
    if expect == "any":
        return path
    if max_bytes is not None and st.st_size > max_bytes:
        limit = f" ({bound})" if bound else ""
        raise InputError(path, key, f"{what} is {_gib(st.st_size)}, more than the "
                                    f"{_gib(max_bytes)} bound{limit}; refused before reading")
    holes = hole_bytes(path, st)
    if holes:
        raise InputError(path, key, f"{what} is a sparse file: {_gib(st.st_size)} long, "
                                    f"{_gib(holes)} of it holes never written (read back as "
                                    "zeros); refused before reading")
    return path


def _check_entries(directory: Path, key: str | None, what: str) -> None:
    """No entry of ``directory`` (links followed) is a FIFO, device or socket."""
    try:
        with os.scandir(directory) as entries:
            for n, entry in enumerate(entries):
                if n >= _MAX_ENTRIES:
                    break
                try:
                    mode = os.stat(entry.path).st_mode
                except OSError:
                    continue  # a dangling link: the loader that wants it says so
                kind = special_kind(mode)
                if kind is not None:
                    raise InputError(
                        entry.path, key, f"{entry.name} in the {what} is {kind}"
                        f"{_link_note(Path(entry.path))}; only regular files are read")
    except OSError as exc:
        raise InputError(directory, key, f"cannot list {what}: {exc.strerror or exc}") from None


def read_text(
    path: str | Path, key: str | None, *, what: str = "input file",
    max_bytes: int | None = None, bound: str | None = None,
) -> str:
    """The UTF-8 text of a regular file (:func:`check_input` first); unreadable: InputError."""
    path = check_input(path, key, what=what, max_bytes=max_bytes, bound=bound)
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(path, key, f"{what} is not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise InputError(path, key, f"cannot read {what}: {exc.strerror or exc}") from None



def read_head(path: str | Path, key: str | None, *, what: str, size: int) -> bytes:
    """The first ``size`` bytes of a regular file (:func:`check_input` first)."""
    path = check_input(path, key, what=what)
    try:
        with path.open("rb") as handle:
            return handle.read(size)
    except OSError as exc:
        raise InputError(path, key, f"cannot read {what}: {exc.strerror or exc}") from None


MAX_ZIP_RATIO = 100
"""A zip member (an SB3 checkpoint's ``policy.pth``) that declares more than this many times
its compressed size, and more than :data:`SPARSE_MIN_BYTES`, is a zip bomb: tensors of
trained weights compress by ~1.1x, and even an all-zero tensor the gate has to hold whole is
not worth inflating a thousandfold."""


def check_zip_member(
    info: zipfile.ZipInfo, path: Path, key: str | None, *,
    what: str = "zip member", max_bytes: int | None = None,
) -> None:
    """A zip member's declared uncompressed size: over ``max_bytes``, or over
    :data:`MAX_ZIP_RATIO` times its compressed size (and :data:`SPARSE_MIN_BYTES`), it is
    refused, from the zip directory alone."""
    size, packed = info.file_size, max(info.compress_size, 1)
    name = info.filename
    if max_bytes is not None and size > max_bytes:
        raise InputError(path, key, f"{what} {name} declares {_gib(size)}, more than the "
                                    f"{_gib(max_bytes)} bound; refused before inflating it")
    if size > SPARSE_MIN_BYTES and size > MAX_ZIP_RATIO * packed:
        raise InputError(path, key, f"{what} {name} declares {_gib(size)} from "
                                    f"{_gib(packed)} compressed ({size // packed}x, more than "
                                    f"MAX_ZIP_RATIO {MAX_ZIP_RATIO}x): a zip bomb; refused "
                                    "before inflating it")


def check_zip_members(
    path: Path, key: str | None, *, what: str = "zip member", max_bytes: int | None = None,
) -> None:
    """:func:`check_zip_member` for every member of the zip file ``path`` (a no-op for a
    file that is not a zip); nothing is inflated."""
    if not zipfile.is_zipfile(path):
        return
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            check_zip_member(info, path, key, what=what, max_bytes=max_bytes)


def read_zip_member(
    archive: zipfile.ZipFile, name: str, path: Path, key: str | None, *,
    what: str = "zip member", max_bytes: int | None = None,
) -> bytes:
    """The bytes of member ``name`` of the zip ``archive`` (the file ``path``), once
    :func:`check_zip_member` has judged its declared size."""
    check_zip_member(archive.getinfo(name), path, key, what=what, max_bytes=max_bytes)
    return archive.read(name)


def _npy_header_bytes(fh: Any) -> int:
    """Bytes of array data an ``.npy`` stream's header declares (shape x itemsize)."""
    import numpy as np

    version = np.lib.format.read_magic(fh)
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(fh)
    else:
        shape, _, dtype = np.lib.format.read_array_header_2_0(fh)
    count = 1
    for dim in shape:
        count *= int(dim)
    return count * int(dtype.itemsize)


def declared_array_bytes(path: Path) -> int:
    """Array bytes an ``.npy`` or ``.npz`` file declares, read from its zip directory and
    array headers only: the larger of the members' uncompressed sizes and their headers'."""
    if zipfile.is_zipfile(path):
        total = 0
        with zipfile.ZipFile(path) as archive:
            infos = archive.infolist()
            declared = sum(info.file_size for info in infos)
            for info in infos:
                if info.filename.endswith(".npy"):
                    with archive.open(info) as member:
                        total += _npy_header_bytes(member)
        return max(declared, total)
    with open(path, "rb") as fh:
        return _npy_header_bytes(fh)


def check_array_file(path: str | Path, key: str | None, *, what: str = "array file") -> Path:
    """:func:`check_input` for a ``.npy`` / ``.npz`` file, and its declared array bytes
    (:func:`declared_array_bytes`) within :data:`MAX_ARRAY_BYTES`; nothing is inflated."""
    path = check_input(path, key, what=what, max_bytes=MAX_ARRAY_BYTES,
                       bound="MAX_ARRAY_BYTES")
    try:
        declared = declared_array_bytes(path)
    except Exception as exc:  # a header or zip directory that does not parse
        raise InputError(path, key, f"unreadable {what}: {type(exc).__name__}: {exc}") from None
    if declared > MAX_ARRAY_BYTES:
        raise InputError(path, key, f"{what} declares {_gib(declared)} of array data, more "
                                    f"than the {_gib(MAX_ARRAY_BYTES)} bound (MAX_ARRAY_BYTES); "
                                    "refused before inflating it")
    return path


def load_arrays(path: str | Path, key: str | None, *, what: str = "array file") -> Any:
    """``np.load`` of a ``.npy`` / ``.npz`` file, never pickled objects, after
    :func:`check_array_file`: a zip bomb or a header declaring terabytes is refused before
    any member is inflated. An ``.npz`` comes back as ``{name: array}`` (read whole, the
    archive closed), an ``.npy`` as its array."""
    import numpy as np

    path = check_array_file(path, key, what=what)
    try:
        loaded = np.load(path, allow_pickle=False)
        if hasattr(loaded, "files"):
            with loaded:
                return {name: loaded[name] for name in loaded.files}
        return loaded
    except Exception as exc:
        raise InputError(path, key, f"unreadable {what}: {exc}") from None
