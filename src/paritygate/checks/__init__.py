"""Registry of checks, one module per check id (its ``CHECK`` spec and ``POSITION``), found in
this package; it validates the check ids and thresholds a gate config names.

Which checks exist, in what order and for which families is read from ``_index.py``, a file
generated from the modules (``python -m paritygate.report.docgen``), so a run imports only the
modules of its own family's checks. When the modules on disk are not the index's (one added or
removed and the index not regenerated) every module is imported and read instead: the index
saves imports, it never decides what a check is.
"""

from __future__ import annotations

import importlib
import math
import pkgutil
from pathlib import Path
from typing import TYPE_CHECKING

from paritygate.check import CheckSpec
from paritygate.checks._index import FAMILIES

if TYPE_CHECKING:
    from paritygate.config import GateConfig


def scan() -> dict[str, tuple[str, ...]]:
    """Every check module's id and families, in checklist order (each module's ``POSITION``),
    read by importing every module: what ``_index.py`` holds when it is current."""
    names = [m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")]
    modules = {n: importlib.import_module(f"{__name__}.{n}") for n in names}
    ordered = sorted(names, key=lambda n: (modules[n].POSITION, n))
    return {n: modules[n].CHECK.families for n in ordered}


def _registered() -> dict[str, tuple[str, ...]]:
    """The index when it names exactly the check modules on disk, else a fresh scan: a new
    check is registered by adding its module, nothing else."""
    names = {m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")}
    return dict(FAMILIES) if names == set(FAMILIES) else scan()


_FAMILIES = _registered()
CHECK_IDS: tuple[str, ...] = tuple(_FAMILIES)
"""Every check id, in checklist order."""


def get_check(check_id: str) -> CheckSpec:
    """Return the spec of ``check_id`` (KeyError for an unknown id)."""
    if check_id not in CHECK_IDS:
        raise KeyError(check_id)
    module = importlib.import_module(f"paritygate.checks.{check_id}")
    spec: CheckSpec = module.CHECK
    return spec


def checks_for(family: str) -> list[CheckSpec]:
    """All checks that apply to a model family, in checklist order (only their modules are
    imported)."""
    return [get_check(cid) for cid in CHECK_IDS if family in _FAMILIES[cid]]


def validate_config(config: GateConfig, path: Path) -> None:
    """``config``'s check ids (``checks``, ``skip_checks``) are checks its family's gate runs
    (as ``--check`` requires), and its ``thresholds`` name checks and metrics they know; raises
    :class:`~paritygate.errors.InputError` naming ``path`` and the key."""
    from paritygate.errors import InputError

    runs = [c.id for c in checks_for(config.family)]
    for key in ("checks", "skip_checks"):
        for cid in getattr(config, key) or []:
            if cid not in CHECK_IDS:
                raise InputError(path, key,
                                 f"unknown check id {cid!r}; known: {', '.join(CHECK_IDS)}")
            if cid not in runs:
                raise InputError(path, key, f"{cid} is not a check this {config.family} gate "
                                 f"runs; its checks: {', '.join(runs)}")
    for cid, values in config.thresholds.items():
        if cid not in CHECK_IDS:
            raise InputError(
                path, f"thresholds.{cid}", f"unknown check id; known: {', '.join(CHECK_IDS)}"
            )
        known = get_check(cid).defaults
        for metric, value in values.items():
            if metric not in known:
                choices = ", ".join(sorted(known)) or "none"
                raise InputError(
                    path, f"thresholds.{cid}.{metric}", f"unknown threshold; known: {choices}"
                )
            if value is not None and not math.isfinite(value):
                raise InputError(
                    path,
                    f"thresholds.{cid}.{metric}",
                    f"threshold must be a finite number, or null to make the metric "
                    f"informational (got {value})",
                )
