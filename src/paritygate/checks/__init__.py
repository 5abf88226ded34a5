"""Registry of checks, one module per check id (its ``CHECK`` spec), found in this package."""

from __future__ import annotations

import importlib
import pkgutil

from paritygate.check import CheckSpec


def _discover() -> tuple[str, ...]:
    """The ids of the check modules in this package, in checklist order (each module's
    ``POSITION``): a new check is registered by adding its module, nothing else."""
    names = [m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")]
    position = {n: importlib.import_module(f"{__name__}.{n}").POSITION for n in names}
    return tuple(sorted(names, key=lambda n: (position[n], n)))


CHECK_IDS: tuple[str, ...] = _discover()
"""Every check id, in checklist order."""


def get_check(check_id: str) -> CheckSpec:
    """Return the spec of ``check_id`` (KeyError for an unknown id)."""
    if check_id not in CHECK_IDS:
        raise KeyError(check_id)
    module = importlib.import_module(f"paritygate.checks.{check_id}")
    spec: CheckSpec = module.CHECK
    return spec


def checks_for(family: str) -> list[CheckSpec]:
    """All checks that apply to a model family, in checklist order."""
    return [spec for cid in CHECK_IDS if family in (spec := get_check(cid)).families]
