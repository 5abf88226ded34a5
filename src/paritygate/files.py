"""Files the gate writes: atomic text, bytes and plots, JSON, and the writability probe.

The ground floor of the package (it imports nothing of paritygate): golden baselines,
reports, exports and the precision artifacts all write through it, so a reader never
sees a half-written file and a killed writer leaves at most a stale temp file.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    import filelock
    from matplotlib.figure import Figure

STALE_TMP_S = 60.0
"""A temp file older than this is a leftover of a killed writer: a live write takes
milliseconds, so a concurrent writer (pytest-xdist) is never raced."""


def _umask_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def clean_stale_temps(path: Path, *, older_than_s: float = STALE_TMP_S) -> list[Path]:
    """Remove ``.<name>.*.tmp`` leftovers of ``path`` that a killed writer left behind."""
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


def _stage(path: Path, write: Callable[[IO[bytes]], object]) -> str:
    """``write(fh)`` on a new temp file beside ``path`` (its name returned), not yet in place;
    stale temp files of killed writers are removed first (:func:`clean_stale_temps`), and on
    any error, an interrupt included, the temp file goes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_temps(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
        os.chmod(tmp, _umask_mode())  # mkstemp creates 0600; reports and golden are shared files
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return tmp


def atomic_write(path: Path, write: Callable[[IO[bytes]], object]) -> Path:
    """Call ``write(fh)`` on a temp file beside ``path``, then ``os.replace`` it into place.

    Safe under pytest-xdist and for readers polling ``path``: they see the old file or the
    new one, never a partial one (:func:`_stage` says what happens to the temp file).
    """
    tmp = _stage(path, write)
    try:
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _writer(data: bytes) -> Callable[[IO[bytes]], object]:
    """A ``write(fh)`` callback that writes ``data``."""
    return lambda fh: fh.write(data)


def atomic_write_many(files: dict[Path, bytes]) -> list[Path]:
    """Write several files as one change: every file is staged beside its target first, then
    each is renamed into place. A write that fails (a full disk) fails while staging, before
    any target changes, and removes what it staged; renames take no space."""
    staged: list[tuple[str, Path]] = []
    try:
        for path, data in files.items():
            staged.append((_stage(path, _writer(data)), path))
        for tmp, path in staged:
            os.replace(tmp, path)
    finally:
        for tmp, _ in staged:
            Path(tmp).unlink(missing_ok=True)
    return [path for _, path in staged]


def atomic_write_bytes(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (:func:`atomic_write`)."""
    return atomic_write(path, _writer(data))


def atomic_write_text(path: Path, text: str) -> Path:
    """Write UTF-8 ``text`` to ``path`` atomically (:func:`atomic_write`)."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_savefig(fig: Figure, path: Path, **kwargs: Any) -> Path:
    """Save a matplotlib figure to ``path`` atomically (format taken from the suffix)."""
    fmt = str(kwargs.pop("format", path.suffix.lstrip(".") or "png"))
    return atomic_write(path, lambda fh: fig.savefig(fh, format=fmt, **kwargs))


def json_default(obj: object) -> object:
    """JSON for numpy scalars/arrays and paths that checks may leave in details."""
    tolist = getattr(obj, "tolist", None)
    if callable(tolist):
        return tolist()
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, (set, tuple)):
        return list(obj)
    return str(obj)


def dump_json(data: object) -> str:
    """Indented, key-sorted JSON text (NaN allowed) ending in a newline."""
    return json.dumps(data, indent=2, sort_keys=True, allow_nan=True, default=json_default) + "\n"


def unwritable_reason(target: Path) -> str | None:
    """Why files cannot be created under the folder ``target``, or ``None`` when they can.

    Decided on the resolved path (symlinks followed, a dangling link included), so a link
    into a read-only mount or onto a missing folder is caught before any work is done.
    """
    resolved = Path(os.path.realpath(os.path.abspath(target)))
    probe = resolved
    while not probe.exists() and probe != probe.parent:
        if probe.is_symlink():  # a dangling link that realpath could not follow (a loop)
            return f"{probe} is a symbolic link that leads nowhere"
        probe = probe.parent
    if not probe.is_dir():
        where = "is a file" if probe == resolved else f"is under a regular file {probe}"
        return f"the folder {where}"
    if not os.access(probe, os.W_OK | os.X_OK):
        shown = probe if resolved == Path(os.path.abspath(target)) else f"{probe} (via a link)"
        return f"{shown} is not writable"
    for stale in probe.glob(f"{WRITE_PROBE}*"):  # left by a process killed mid-probe
        try:
            if time.time() - stale.stat().st_mtime > STALE_TMP_S:
                stale.unlink()
        except OSError:
            continue
    try:
        fd, tmp = tempfile.mkstemp(prefix=WRITE_PROBE, dir=probe)
    except OSError as exc:  # a read-only mount passes os.access for root
        return f"{probe}: {exc.strerror}"
    try:
        os.close(fd)
    finally:
        os.unlink(tmp)  # also when an interrupt lands here
    return None


WRITE_PROBE = ".paritygate-write-probe."
"""Name prefix of the empty file :func:`unwritable_reason` creates and removes."""


class LockHeld(Exception):
    """Another live process holds the lock file (its pid, when it wrote one)."""

    def __init__(self, path: Path, pid: int | None) -> None:
        super().__init__(f"{path} is held by pid {pid}")
        self.path = path
        self.pid = pid


class FileLock:
    """An exclusive, non-blocking lock on ``path`` (:class:`filelock.FileLock`) that names its
    holder's pid.

    ``flock`` where the platform has it: the kernel drops the lock when its holder dies, so a
    killed process never leaves a lock that blocks the next run (the file stays, and is
    taken over). The holder writes its pid into the file for the message of a second run.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock: filelock.BaseFileLock | None = None

    def acquire(self) -> FileLock:
        """Take the lock or raise :class:`LockHeld`; ``OSError`` when it cannot be created."""
        if self._lock is not None:
            return self
        import filelock  # only a blessing run locks: no import cost for the others

        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock = filelock.FileLock(str(self.path), timeout=0, thread_local=False)
        try:
            lock.acquire()
        except filelock.Timeout:
            raise LockHeld(self.path, _read_pid(self.path)) from None
        self._lock = lock
        try:
            self.path.write_text(f"{os.getpid()}\n", encoding="utf-8")
        except OSError:
            self.release()
            raise
        return self

    def release(self) -> None:
        """Drop the lock (a no-op when not held)."""
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release(force=True)

    @property
    def held(self) -> bool:
        return self._lock is not None


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text(encoding="utf-8").split()[0])
    except (OSError, ValueError, IndexError):
        return None
