"""Resolve ``module:callable`` strings named by a gate config (user code, never checkpoint code).

A config's ``python_path`` folders (relative to the config file) are put in front of
``sys.path`` before its first import, so a user does not need ``PYTHONPATH``.
"""

from __future__ import annotations

import pkgutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

from paritygate.errors import InputError

F = TypeVar("F", bound=Callable[..., Any])

_PYTHON_PATHS: dict[Path, list[Path]] = {}
"""``python_path`` folders of each loaded config, keyed by the config file."""


def register_python_path(config_file: Path, folders: list[Path]) -> None:
    """Remember ``folders`` for imports named by ``config_file`` (added on first import)."""
    _PYTHON_PATHS[Path(config_file)] = list(folders)


def _activate(file: Path) -> None:
    folders = _PYTHON_PATHS.get(Path(file)) if file is not None else None
    for i, folder in enumerate(folders or []):
        if not folder.is_dir():
            raise InputError(file, f"python_path[{i}]", f"folder not found: {folder}")
    for folder in reversed(folders or []):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))


def import_callable(spec: str, file: Path, key: str) -> Callable[..., Any]:
    """Resolve ``module:callable`` (dotted attribute path allowed) with
    :func:`pkgutil.resolve_name`, or raise InputError naming ``key``."""
    if ":" not in spec:
        raise InputError(file, key, f"expected 'module:callable', got {spec!r}")
    _activate(file)
    module_name, attr = spec.split(":", 1)
    try:
        obj = pkgutil.resolve_name(spec)
    except ValueError:
        raise InputError(file, key, f"expected 'module:callable', got {spec!r}") from None
    except AttributeError as exc:
        if module_name not in sys.modules:  # raised while the module itself was imported
            raise InputError(file, key, f"cannot import {module_name!r}: "
                             f"{type(exc).__name__}: {exc}") from None
        raise InputError(file, key, f"{module_name!r} has no attribute {attr!r}") from None
    except Exception as exc:
        hint = ""
        if isinstance(exc, ModuleNotFoundError) and exc.name == module_name.split(".")[0]:
            hint = (" (install it, or add the folder that holds it to python_path, "
                    "relative to the config)")
        raise InputError(
            file, key, f"cannot import {module_name!r}: {type(exc).__name__}: {exc}{hint}"
        ) from None
    if not callable(obj):
        raise InputError(file, key, f"{spec!r} is not callable")
    return cast("Callable[..., Any]", obj)


def guard_user_code(fn: F, file: Path, key: str) -> F:
    """``fn`` whose exceptions are bad input naming the config ``key`` that named it.

    User code the gate calls mid-check (a trainer's log-prob function) failing is an input
    the gate cannot verify, not a gate error; a model's NaN/Inf output and bad input raised
    inside pass through unchanged. Attributes of ``fn`` (e.g. ``convention``) are kept.
    """
    import functools

    from paritygate.errors import NonFiniteOutput

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (InputError, NonFiniteOutput):
            raise
        except Exception as exc:
            raise InputError(file, key, f"raised {type(exc).__name__}: {exc}") from None

    return cast("F", call)
