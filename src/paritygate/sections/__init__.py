"""The checks' own config blocks: one module per check that has one, named by the check's id.

Each module defines its block as a :class:`Section` (a strict pydantic model): the family whose
section holds it, the key it sits under there and the line the config reference shows for it.
A family's config composes the sections of its family found here (``compose``), so a new
check's block is its own module and no shared schema is edited. This package sits below both
the checks and the families' configs: a config is validated before any check is imported, and
a check reads its block with ``Section.of(spec)``.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import ClassVar, TypeVar

from pydantic import BaseModel, create_model

from paritygate.config_base import StrictModel

_S = TypeVar("_S", bound="Section")
_M = TypeVar("_M", bound=BaseModel)


class Section(StrictModel):
    """A check's block under ``<FAMILY>.<KEY>``; absent (``None``) unless the config sets it."""

    FAMILY: ClassVar[str]
    """The family section that holds the block (``causal_lm``)."""
    KEY: ClassVar[str]
    """The block's key in that section."""
    FIELD_DOC: ClassVar[str]
    """What the block is for, in one line (the config reference's description of the key)."""

    @classmethod
    def of(cls: type[_S], spec: BaseModel) -> _S | None:
        """The block as ``spec`` (the family's section) holds it, ``None`` when unset."""
        value = getattr(spec, cls.KEY, None)
        return value if isinstance(value, cls) else None


def sections(family: str) -> list[type[Section]]:
    """The family's sections, in the order of their modules' names (the checks' ids)."""
    found: list[type[Section]] = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        section: type[Section] = importlib.import_module(f"{__name__}.{info.name}").SECTION
        if family == section.FAMILY:
            found.append(section)
    return found


def compose(base: type[_M], family: str) -> type[_M]:
    """``base`` with each of the family's sections as an optional field after its own (its
    name, module and validators kept: errors, the schema and the config reference read alike)."""
    fields: dict[str, object] = {s.KEY: (s | None, None) for s in sections(family)}
    composed: type[_M] = create_model(base.__name__, __base__=base,  # type: ignore[call-overload]
                                      __module__=base.__module__, **fields)
    composed.__doc__ = base.__doc__
    return composed
