"""Model families: one package each, with the same parts.

Each family package (``policy``, ``causal_lm``, ``hf_model``) has ``context`` (loading and
validation of every input, the object the checks receive), ``probes`` (the inputs the checks
feed) and ``export`` (the serving artifact and its manifest); its section of the gate config
is a schema in :mod:`paritygate.config` (``paritygate.config.<family>``), below the families.
The package exposes ``build_context(config, *, needs)`` (``needs``: what the run's checks
need, :data:`paritygate.check.NEEDS`; ``None`` builds everything) and
``export_artifact(config, out_dir)``; checks reach family helpers through the context.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Collection

    from paritygate.config import GateConfig
    from paritygate.families.base import Context

FAMILIES: tuple[str, ...] = ("policy", "causal_lm", "hf_model")


def family_package(family: str) -> ModuleType:
    """The package of ``family`` (KeyError for an unknown family)."""
    if family not in FAMILIES:
        raise KeyError(family)
    return importlib.import_module(f"paritygate.families.{family}")


def build_context(config: GateConfig, *, needs: Collection[str] | None = None) -> Context:
    """Load and validate the inputs of ``config``'s family that ``needs`` names (every one when
    ``None``; none that loads when empty, where the family has a config-only context: causal
    LM); raises ``InputError``, naming the config key of the file it is about
    (:meth:`GateConfig.key_error`)."""
    from paritygate.errors import InputError

    package = family_package(config.family)
    try:
        context: Context = package.build_context(config, needs=needs)
    except InputError as exc:
        raise config.key_error(exc) from None
    return context


def export(config: GateConfig, out_dir: Path) -> Path:
    """Build the serving artifact of ``config`` into ``out_dir``; returns the manifest path."""
    from paritygate.errors import InputError

    try:
        path: Path = family_package(config.family).export_artifact(config, out_dir)
    except InputError as exc:
        raise config.key_error(exc) from None
    return path
