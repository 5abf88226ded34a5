"""The contract every model-family context satisfies."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from paritygate.config import GateConfig
    from paritygate.precision.subject import PrecisionSubject
    from paritygate.result import Measurement


class Context(Protocol):
    """Loaded inputs of one gate run, shared by every check of a family.

    Built once per process by :class:`paritygate.gate.Gate`; building it
    validates every input and raises :class:`paritygate.errors.InputError`.
    A check's measurement is typed on its own family's context, which has more.
    """

    @property
    def config(self) -> GateConfig: ...

    @property
    def checkpoint_path(self) -> Path: ...

    @property
    def checkpoint_sha256(self) -> str: ...

    @property
    def probes_sha256(self) -> str:
        """Digest of the probe set; golden baselines record it so drift is caught."""
        ...

    @property
    def numerics(self) -> Mapping[str, str]:
        """Settings that move numbers by design (a serving dtype), recorded with a baseline;
        empty for a family without such settings."""
        ...

    def note_probes(self, m: Measurement) -> None:
        """Tell a measurement of a check that feeds the model-input probes which probe rows
        the context left out of them, and why (nothing to say for most families)."""
        ...

    def precision_subject(self) -> PrecisionSubject | None: ...
