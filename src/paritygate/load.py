"""Loading a gate config: the YAML, the schema (:class:`paritygate.config.GateConfig`) and the
check registry's ids and thresholds (:func:`paritygate.checks.validate_config`), every error
naming the file and the key."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from paritygate.checks import validate_config
from paritygate.config import GateConfig, apply_checkpoint
from paritygate.errors import InputError, shorten
from paritygate.trainer_output import CHECKPOINT_ENV


def _format_loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


MAX_ECHO_CHARS = 200
"""At most this much of a wrong value is echoed in an error line."""


def _echo(value: object) -> str:
    """``repr(value)``, cut: a hostile value must not become a megabyte error line."""
    return shorten(_short_repr(value), MAX_ECHO_CHARS)


def _short_repr(value: object) -> str:
    """A repr that stops early on deep or long containers (``reprlib``), plain otherwise."""
    import reprlib

    short = reprlib.Repr()
    short.maxlevel, short.maxdict, short.maxlist, short.maxtuple, short.maxset = 3, 8, 8, 8, 8
    short.maxstring = short.maxother = MAX_ECHO_CHARS
    return short.repr(value) if isinstance(value, (dict, list, tuple, set, str)) else repr(value)


def _describe_error(err: ErrorDetails) -> tuple[str | None, str]:
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    if loc and loc[-1] in ("float", "none") and len(loc) >= 3 and loc[0] == "thresholds":
        loc = loc[:-1]  # the union branch (float | None) is not a key
    kind = err["type"]
    if kind == "extra_forbidden":
        cause = "unknown key"
    elif kind == "missing":
        cause = "required key is missing"
    else:
        msg = err["msg"].removeprefix("Value error, ")
        cause = f"{msg} (got {_echo(err.get('input'))})" if kind != "value_error" else msg
    return _format_loc(loc) or None, cause


def config_from_dict(data: object, path: Path) -> GateConfig:
    """Validate a parsed config; raises :class:`InputError` naming the first bad key."""
    if not isinstance(data, dict):
        raise InputError(path, None, "config must be a YAML mapping")
    try:
        config = GateConfig.model_validate(data, context={"base_dir": Path(path).resolve().parent})
    except ValidationError as exc:
        problems = [_describe_error(err) for err in exc.errors()]
        key, cause = problems[0]
        # Every problem at once, still on one line: the first names the key, the rest follow.
        rest = [f"{k}: {c}" if k else c for k, c in problems[1:]]
        raise InputError(path, key, "; ".join([cause, *rest])) from None
    config._path = Path(path).resolve()
    validate_config(config, path)
    config = apply_checkpoint(config, os.environ.get(CHECKPOINT_ENV))
    _refuse_special_files(config)
    from paritygate.imports import register_python_path

    register_python_path(config.path, list(config.python_path))
    return config


def _refuse_special_files(config: GateConfig) -> None:
    """No path the config names is a FIFO, device or socket (links followed): refused at load,
    naming the key, before any reader could block on one. Each reader checks its file again
    (:func:`paritygate.reading.check_input`) with its own size bounds."""
    from paritygate.reading import check_input

    for key, target in config.named_paths().items():
        check_input(target, key, what="input", expect="any")


def load_config(path: str | Path) -> GateConfig:
    """Read and validate a gate config file."""
    from paritygate.reading import MAX_CONFIG_BYTES, read_text
    from paritygate.reading_text import parse_yaml

    p = Path(path)
    if p.is_dir():
        raise InputError(p, None, "config is a directory, expected a YAML file")
    text = read_text(p, None, what="config file", max_bytes=MAX_CONFIG_BYTES,
                     bound="MAX_CONFIG_BYTES")
    data = parse_yaml(text, p)
    _refuse_todos(data, p)
    return config_from_dict(data, p)


def _refuse_todos(data: object, path: Path) -> None:
    """A config from ``paritygate init`` runs only once every ``TODO`` value is filled in."""
    from paritygate.init_infer import find_todos

    todos = find_todos(data)
    if todos:
        more = f" (and {len(todos) - 1} more: {', '.join(todos[1:])})" if len(todos) > 1 else ""
        raise InputError(path, todos[0], f"still TODO: replace the placeholder{more}")
