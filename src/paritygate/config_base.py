"""Shared pieces of the config schema: a strict base model and path helpers."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    PlainSerializer,
    SerializationInfo,
    ValidationInfo,
    WithJsonSchema,
)
from pydantic_core import PydanticCustomError

Dtype = Literal["float32", "bfloat16", "float16"]
"""A model's dtype, as a config names it."""


class StrictModel(BaseModel):
    """Config section: unknown keys and wrong types are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def _as_path(value: object) -> Path:
    """A path value is a string in the config (YAML has no path type)."""
    if isinstance(value, Path):
        return value
    if not isinstance(value, str):
        raise PydanticCustomError("string_type", "Input should be a valid string")
    if not value.strip():  # Path("") is the current folder: a path nobody meant
        raise PydanticCustomError("path_empty", "an empty path names no file (leave the key out)")
    return Path(value)


def _from_config_folder(value: Path, info: ValidationInfo) -> Path:
    """Relative to the config file's folder: the loader passes it as the validation context's
    ``base_dir`` (:func:`paritygate.load.config_from_dict`), so every path is resolved once,
    when the config loads. Without one (a section built in code) the value stays as written."""
    base = (info.context or {}).get("base_dir")
    p = value.expanduser()
    return p if p.is_absolute() or base is None else (Path(base) / p).resolve()


def _as_written(value: Path, info: SerializationInfo) -> str:
    """Serialised relative to the serialisation context's ``base_dir`` (the config file's
    folder), as a relative path is written: the config's digest does not change with the
    folder a checkout sits in."""
    base = (info.context or {}).get("base_dir")
    try:
        return os.path.relpath(value, base) if base is not None else str(value)
    except ValueError:  # another drive
        return str(value)


ConfigPath = Annotated[Path, BeforeValidator(_as_path), AfterValidator(_from_config_folder),
                       PlainSerializer(_as_written), WithJsonSchema({"type": "string"})]
"""A file or folder the config names, written as a string relative to the config file and
held as an absolute :class:`~pathlib.Path` once loaded."""
