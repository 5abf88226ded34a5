"""Model families: one package each, with the same parts.

Each family package (``policy``, ``causal_lm``, ``hf_model``) has ``context`` (loading and
validation of every input, the object the checks receive), ``probes`` (the inputs the checks
feed) and ``export`` (the serving artifact and its manifest); its section of the gate config
is a schema in :mod:`paritygate.config` (``paritygate.config.<family>``), below the families.
The package exposes ``build_context(config, *, config_only)`` (``config_only``: what
config-only checks read, where the family has any) and ``export_artifact(config, out_dir)``;
checks reach family helpers through the context.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from paritygate.config import GateConfig
    from paritygate.families.base import Context

FAMILIES: tuple[str, ...] = ("policy", "causal_lm", "hf_model")


def family_package(family: str) -> ModuleType:
    """The package of ``family`` (KeyError for an unknown family)."""
    if family not in FAMILIES:
        raise KeyError(family)
    return importlib.import_module(f"paritygate.families.{family}")


def build_context(config: GateConfig, *, config_only: bool = False) -> Context:
    """Load and validate every input of ``config``'s family; raises ``InputError``, naming
    the config key of the file it is about (:meth:`GateConfig.key_error`). ``config_only``:
    only what config-only checks read, where the family has such a context (causal LM)."""
    from paritygate.errors import InputError

    package = family_package(config.family)
    try:
        context: Context = package.build_context(config, config_only=config_only)
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
