"""Errors that end the gate with exit code 2: the input, not the policy, is wrong."""

from __future__ import annotations

from pathlib import Path


class InputError(Exception):
    """Bad input: config, checkpoint, artifact or probes unreadable or invalid.

    Rendered as one line, ``FILE: KEY: cause``, so a CI log names exactly what to fix.
    """

    def __init__(self, file: str | Path | None, key: str | None, cause: str) -> None:
        self.file = str(file) if file is not None else None
        self.key = key
        self.cause = " ".join(str(cause).split())
        super().__init__(self.line())

    def line(self) -> str:
        parts = [p for p in (self.file, self.key) if p]
        return ": ".join([*parts, self.cause])


class MissingExtra(InputError):
    """An optional dependency needed by the configured engine is not installed."""

    def __init__(self, module: str, extra: str) -> None:
        super().__init__(
            None,
            None,
            f"{module} is not installed; install it with: pip install 'paritygate[{extra}]'",
        )


class NonFiniteOutput(Exception):
    """A model produced NaN/Inf where a measurement needs finite numbers (sampling from its
    distribution, scoring a token). Not bad input: the check that hit it fails by this cause
    (:meth:`paritygate.gate.Gate.measure` turns it into a named finding), never ``error``."""
