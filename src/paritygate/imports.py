"""Resolve ``module:callable`` strings named by a gate config (user code, never checkpoint code)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from paritygate.errors import InputError


def import_callable(spec: str, file: Path, key: str) -> Any:
    """Resolve ``module:callable`` (dotted attribute path allowed), or raise InputError."""
    if ":" not in spec:
        raise InputError(file, key, f"expected 'module:callable', got {spec!r}")
    module_name, attr = spec.split(":", 1)
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:
        raise InputError(
            file, key, f"cannot import {module_name!r}: {type(exc).__name__}: {exc}"
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise InputError(file, key, f"{module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise InputError(file, key, f"{spec!r} is not callable")
    return obj
