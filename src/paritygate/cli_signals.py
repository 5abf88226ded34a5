"""SIGINT and SIGTERM during a ``paritygate`` command: both stop the run the way Ctrl-C does
(no report, golden untouched); one that lands inside an import is delivered again."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import signal
    from collections.abc import Callable

    Handler = Callable[[int, FrameType | None], object] | int | signal.Handlers | None

__all__ = ["REDELIVER_S", "Signals", "Terminated", "importing", "interrupts_deferred"]


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is so the run stops the way Ctrl-C stops it: no
    report, golden untouched, exit 143."""


REDELIVER_S = 0.05
"""An interrupt that arrives while a module is being imported is delivered again this much
later: raised inside an extension module's initialisation it would abort the interpreter."""


def importing(frame: FrameType | None) -> bool:
    """Whether the interrupted Python frame is inside an import."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


class Signals:
    """SIGINT and SIGTERM as interrupts (:class:`KeyboardInterrupt`, :class:`Terminated`) in
    the main thread for one command, each one recorded (:attr:`received`)."""

    def __init__(self) -> None:
        import signal
        import threading

        self.received: list[int] = []
        self.previous: dict[int, Handler] = {}
        if threading.current_thread() is not threading.main_thread():
            return
        for name in ("SIGINT", "SIGTERM"):
            if hasattr(signal, name):
                signum = getattr(signal, name)
                self.previous[signum] = signal.signal(signum, self._handle)

    @property
    def last(self) -> str | None:
        import signal

        return signal.Signals(self.received[-1]).name if self.received else None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        import signal
        import threading

        self.received.append(signum)
        if importing(frame):
            timer = threading.Timer(REDELIVER_S, self._redeliver, (signum,))
            timer.daemon = True
            timer.start()
            return
        raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()

    def _redeliver(self, signum: int) -> None:
        if self.previous:  # the command is still running
            os.kill(os.getpid(), signum)

    def restore(self) -> None:
        import signal

        previous, self.previous = self.previous, {}
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM while golden and reports are written (a few milliseconds), so the
    set of files is one run's. A signal that arrives then finds the work done: the run ends
    with its verdict, which the files already say."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    names = [n for n in ("SIGINT", "SIGTERM") if hasattr(signal, n)]
    old = {n: signal.signal(getattr(signal, n), lambda sig, _f: caught.append(sig))
           for n in names}
    try:
        yield
    finally:
        for n, handler in old.items():
            signal.signal(getattr(signal, n), handler)
