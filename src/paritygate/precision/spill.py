"""Kept tensors in a temporary file instead of memory (streamed precision passes).

A streamed model holds one unit's weights at a time, but the fp32 run keeps every measured
layer's inputs and outputs until the low-precision runs compare with them: memory that grows
with depth and probe size. Spilled, a kept tensor is read back only when it is used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

from paritygate.precision.hooks import map_tree


class Spilled:
    """A kept tensor written to the spill file: its place, shape and dtype, no data in memory."""

    def __init__(
        self, spill: SpillFile, offset: int, shape: torch.Size, dtype: torch.dtype
    ) -> None:
        self.spill, self.offset, self.shape, self.dtype = spill, offset, shape, dtype

    def load(self) -> torch.Tensor:
        return self.spill.read(self)


class SpillFile:
    """An unlinked temporary file (in ``TMPDIR``) holding one batch's kept tensors."""

    def __init__(self) -> None:
        import tempfile

        # closed by close() once the batch is compared; unlinked from the start
        self._file = tempfile.TemporaryFile(prefix="paritygate-spill-")  # noqa: SIM115
        self._end = 0

    def write(self, t: torch.Tensor) -> Spilled:
        raw = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
        self._file.seek(self._end)
        self._file.write(memoryview(raw))  # type: ignore[arg-type]  # numpy arrays are buffers
        entry = Spilled(self, self._end, t.shape, t.dtype)
        self._end += raw.nbytes
        return entry

    def read(self, entry: Spilled) -> torch.Tensor:
        value = torch.empty(entry.shape, dtype=entry.dtype)
        raw = value.reshape(-1).view(torch.uint8).numpy()
        self._file.seek(entry.offset)
        self._file.readinto(memoryview(raw))  # type: ignore[arg-type]
        return value

    def close(self) -> None:
        self._file.close()


Kept = torch.Tensor | Spilled
T = TypeVar("T")


def map_kept(obj: T, load: Callable[[Kept], torch.Tensor]) -> T:
    """``obj`` (nested args or kwargs) with every spilled tensor read back by ``load``."""
    return map_tree(obj, lambda x: load(x) if isinstance(x, Spilled) else x)
