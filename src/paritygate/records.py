"""Detail records: what a check keeps for the report besides its metrics, as typed fields.

A check declares its records beside itself, frozen dataclasses deriving from :class:`Record`,
and hands each to :meth:`~paritygate.result.Measurement.record`. A record serialises to its
fields under their names (``field(metadata={"key": ...})`` names another key) into the check's
``details`` in report.json; renderers, the root-cause step and the CLI read it back with
:meth:`Record.read` and use attributes, whether the details are the live ones or a report's
read back from JSON (a pytest-xdist worker's results, a page rendered from report.json).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar, get_args, get_origin

R = TypeVar("R", bound="Record")

OMIT_NONE = {"omit_none": True}
"""Field metadata: the key is left out of the details while the value is ``None`` (a key the
check writes only when it measured it)."""
OMIT_EMPTY = {"omit_none": True, "omit_empty": True}
"""Field metadata: the key is left out while the value is ``None`` or an empty dict."""


class Record:
    """Base of every detail record (subclasses are dataclasses, frozen unless a measurement
    fills them in as it goes, as the precision report's)."""

    NONFINITE_AS_TEXT: ClassVar[bool] = False
    """Write NaN/Inf floats as the strings ``"nan"``/``"inf"``/``"-inf"`` (strict JSON, as
    precision.json is read by other tools); :meth:`read` turns them back into floats."""

    def to_json(self) -> dict[str, object]:
        """``{key: value}`` for each field, nested records as their own ``to_json``."""
        out: dict[str, object] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if f.metadata.get("omit_none") and (
                    value is None or (f.metadata.get("omit_empty") and value == {})):
                continue
            out[f.metadata.get("key", f.name)] = _plain(value, self.NONFINITE_AS_TEXT)
        return out

    @classmethod
    def read(cls: type[R], details: Mapping[str, object]) -> R | None:
        """The record as a check wrote it into ``details``, or ``None`` when a key without a
        default is absent (the check did not record it)."""
        hints = typing.get_type_hints(cls)
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            key = f.metadata.get("key", f.name)
            if key in details:
                values[f.name] = _typed(hints[f.name], details[key])
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                return None
        return cls(**values)


def _plain(value: object, text: bool = False) -> object:
    """``value`` as JSON: records as their ``to_json``; with ``text``, floats as plain floats
    and NaN/Inf as strings."""
    to_json = getattr(value, "to_json", None)
    if callable(to_json) and (isinstance(value, Record) or (
            dataclasses.is_dataclass(value) and not isinstance(value, type))):
        return to_json()
    if isinstance(value, (list, tuple)):
        return [_plain(v, text) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v, text) for k, v in value.items()}
    if text and isinstance(value, float) and not isinstance(value, bool):
        if math.isfinite(value):
            return float(value)
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def _typed(hint: object, value: object) -> object:
    """``value`` (JSON, or as the check left it) as the field's type: nested records rebuilt,
    sequences of records rebuilt item by item; anything else as it is."""
    if isinstance(hint, type) and issubclass(hint, Record):
        return value if isinstance(value, Record) or not isinstance(value, Mapping) \
            else hint.read(value)
    if hint is float and value in ("nan", "inf", "-inf"):
        return float(str(value))  # written by a record with NONFINITE_AS_TEXT
    origin, args = get_origin(hint), get_args(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return None if value is None else _typed(inner[0], value) if len(inner) == 1 else value
    if origin in (list, tuple) and args and isinstance(value, (list, tuple)):
        return origin(_typed(args[0], v) for v in value)
    if origin is dict and len(args) == 2 and isinstance(value, Mapping):
        return {k: _typed(args[1], v) for k, v in value.items()}
    return value


@dataclasses.dataclass(frozen=True)
class Keyed(Record):
    """A record kept under a key the check names as it runs (the finding kind it details, the
    role of a function it measured): ``{key: record}`` in the details."""

    key: str
    record: object
    """A record, a list of records or a plain value."""

    def to_json(self) -> dict[str, object]:
        return {self.key: _plain(self.record)}
