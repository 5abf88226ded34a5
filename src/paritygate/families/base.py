"""The contract every model-family context satisfies."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from paritygate.config import GateConfig
    from paritygate.precision.subject import PrecisionSubject


class Context(Protocol):
    """Loaded inputs of one gate run, shared by every check of a family.

    Built once per process by :class:`paritygate.gate.Gate`; building it
    validates every input and raises :class:`paritygate.errors.InputError`.
    """

    family: str
    config: GateConfig
    checkpoint_path: Path
    checkpoint_sha256: str
    probes_sha256: str
    """Digest of the probe set; golden baselines record it so drift is caught."""

    def precision_subject(self) -> PrecisionSubject: ...
