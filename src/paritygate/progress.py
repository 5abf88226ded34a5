"""Progress for long steps: a bar on a terminal, plain lines in CI and logs.

A bar (tqdm, installed with transformers) is drawn only when the stream is a TTY
and ``CI`` is not set; otherwise each step prints a plain line at every tenth of
its total and one when it ends, so CI logs show progress without escape codes.
Set ``PARITYGATE_PROGRESS=plain`` to force plain lines, ``=off`` to silence them.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any


def use_bar(stream: IO[str] | None = None) -> bool:
    """True when a progress bar may be drawn on ``stream`` (default stderr)."""
    stream = stream if stream is not None else sys.stderr
    mode = os.environ.get("PARITYGATE_PROGRESS", "").lower()
    if mode in ("plain", "off"):
        return False
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        return False
    if os.environ.get("TERM") == "dumb":
        return False
    try:
        if not stream.isatty():
            return False
    except (AttributeError, ValueError):
        return False
    try:
        import tqdm  # noqa: F401
    except ImportError:
        return False
    return True


def _silent() -> bool:
    return os.environ.get("PARITYGATE_PROGRESS", "").lower() == "off"


class Progress:
    """Progress of one counted step: ``advance()`` per unit of work, ``close()`` at the end."""

    def __init__(self, label: str, total: int, *, stream: IO[str] | None = None) -> None:
        self.label = label
        self.total = max(int(total), 1)
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        self._start = time.perf_counter()
        self._next_line = 0
        self._bar: Any = None
        self._closed = False
        if _silent():
            return
        if use_bar(self.stream):
            from tqdm.auto import tqdm

            self._bar = tqdm(total=self.total, desc=label, file=self.stream, leave=True,
                             dynamic_ncols=True)
        else:
            self._line(f"{label}: 0/{self.total}")
            self._next_line = _tenth(self.total, 1)

    def _line(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def advance(self, n: int = 1) -> None:
        self.done = min(self.done + n, self.total)
        if self._bar is not None:
            self._bar.update(n)
        elif not _silent() and self._next_line and self.done >= self._next_line:
            if self.done < self.total:
                pct = 100 * self.done // self.total
                self._line(f"{self.label}: {self.done}/{self.total} ({pct}%)")
            step = self.done * 10 // self.total + 1
            self._next_line = _tenth(self.total, step)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        elapsed = time.perf_counter() - self._start
        if self._bar is not None:
            self._bar.close()
        elif not _silent():
            self._line(f"{self.label}: {self.done}/{self.total} done in {elapsed:.1f}s")

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _tenth(total: int, step: int) -> int:
    """The unit count at which the ``step``-th tenth of ``total`` is reached."""
    return max(1, -(-total * step // 10))


@contextmanager
def stage(label: str, *, stream: IO[str] | None = None) -> Iterator[None]:
    """An uncounted step: elapsed time ticking on a terminal; a start and an end line otherwise."""
    stream = stream if stream is not None else sys.stderr
    start = time.perf_counter()
    if _silent():
        yield
        return
    if not use_bar(stream):
        print(f"{label} ...", file=stream, flush=True)
        ok = False
        try:
            yield
            ok = True
        finally:
            state = "done" if ok else "stopped"
            print(f"{label}: {state} in {time.perf_counter() - start:.1f}s", file=stream,
                  flush=True)
        return
    from tqdm.auto import tqdm

    bar = tqdm(total=None, desc=label, file=stream, leave=True, bar_format="{desc}: {elapsed}")
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(0.5):
            bar.refresh()

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        stop.set()
        ticker.join()
        bar.close()
