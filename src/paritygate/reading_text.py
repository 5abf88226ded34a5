"""Text formats the gate parses (JSON, JSON lines, YAML), with their bounds.

The second floor of the bounded reader (:mod:`paritygate.reading` admits the file): a parser
is never handed what it cannot finish. Nesting depth is measured on the bytes before JSON is
parsed (Python's JSON decoder recurses once per level and raises ``RecursionError`` at about
a thousand); a JSON-lines file is read one line at a time, each line bounded before it is
held; YAML is composed by a loader whose depth and alias expansion are bounded. Every decode
error becomes :class:`~paritygate.errors.InputError` naming the file, the line and the key.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from paritygate.errors import InputError
from paritygate.reading import check_input

JSON = Any
"""A parsed JSON document (its shape is the caller's to check)."""

MAX_NESTING_DEPTH = 200
"""Arrays and objects (YAML sequences and mappings) nest at most 200 levels: the deepest file
the gate reads (a ``tokenizer.json``, a TRL config's ``generation_kwargs``) nests under 10, and
Python's parsers recurse once per level, failing at about 1,000."""

MAX_JSON_BYTES = 64 * 2**20
"""A JSON document read whole (``config.json``, ``trainer_state.json``,
``adapter_config.json``, a manifest, a golden file) is at most 64 MiB: a ``trainer_state.json``
logging 10^5 steps is ~30 MB, and a parsed JSON document holds ~10x its size in memory."""

MAX_LINE_BYTES = 16 * 2**20
"""One line of a JSON-lines file (a rollout-dump record, a serving-log record, a completion) is
at most 16 MiB, measured before the line is held: a 32k-token record with 20 top log-probs per
token is ~13 MB."""

MAX_YAML_ALIAS_VALUES = 100_000
"""YAML aliases add at most this many values to a document: a few hundred bytes of nested
anchors and aliases (an alias bomb) would otherwise expand to billions. Values written out
are not counted (the file's size bounds them)."""

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_PAIR = re.compile(rb"\[\]|\{\}")


def nesting_depth(data: bytes, limit: int = MAX_NESTING_DEPTH) -> int:
    """How deep arrays and objects nest in JSON ``data`` (outside strings), counted without
    recursion and in C-speed passes: ``limit + 1`` as soon as it is known to exceed ``limit``."""
    brackets = _STRING.sub(b"", data).translate(None, _BRACKETS)
    if len(brackets) <= limit:
        return _walk(brackets, limit)
    passes = 0  # each pass removes the innermost pairs: one level of depth
    while brackets and passes <= limit:
        reduced = _PAIR.sub(b"", brackets)
        if len(reduced) == len(brackets):
            break  # unbalanced: what is left is walked
        brackets, passes = reduced, passes + 1
    if passes > limit:
        return limit + 1
    return passes + _walk(brackets, limit - passes) if brackets else passes


def _walk(brackets: bytes, limit: int) -> int:
    """The running depth's maximum over ``brackets``, stopping past ``limit``."""
    depth = deepest = 0
    for byte in brackets:
        depth += 1 if byte in b"[{" else -1
        if depth > deepest:
            deepest = depth
            if deepest > limit:
                break
    return deepest


def parse_json(data: str | bytes, path: Path, key: str | None, *, what: str) -> JSON:
    """``data`` parsed as one JSON document after its depth is bounded; any failure is
    :class:`InputError` naming ``path`` and ``key``."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if nesting_depth(raw) > MAX_NESTING_DEPTH:
        raise InputError(path, key, f"{what} nests deeper than {MAX_NESTING_DEPTH} levels "
                                    "(MAX_NESTING_DEPTH); refused before parsing")
    try:
        return json.loads(raw)
    except UnicodeDecodeError as exc:
        raise InputError(path, key, f"{what} is not UTF-8 text (byte {exc.start})") from None
    except (ValueError, RecursionError) as exc:
        raise InputError(path, key, f"{what} is not JSON: {exc}") from None


def read_json(path: str | Path, key: str | None, *, what: str,
              max_bytes: int = MAX_JSON_BYTES, bound: str = "MAX_JSON_BYTES") -> JSON:
    """A JSON file read whole (at most ``max_bytes``) and parsed by :func:`parse_json`."""
    path = check_input(path, key, what=what, max_bytes=max_bytes, bound=bound)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(path, key, f"cannot read {what}: {exc.strerror or exc}") from None
    return parse_json(data, path, key, what=what)


def check_json_file(path: str | Path, key: str | None, *, what: str) -> Path:
    """A JSON file another library parses (a ``tokenizer.json``): admitted, within
    :data:`MAX_JSON_BYTES`, nesting within :data:`MAX_NESTING_DEPTH`; not parsed here."""
    path = check_input(path, key, what=what, max_bytes=MAX_JSON_BYTES, bound="MAX_JSON_BYTES")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(path, key, f"cannot read {what}: {exc.strerror or exc}") from None
    if nesting_depth(data) > MAX_NESTING_DEPTH:
        raise InputError(path, key, f"{what} nests deeper than {MAX_NESTING_DEPTH} levels "
                                    "(MAX_NESTING_DEPTH); refused before parsing")
    return path


def read_json_object(path: str | Path, key: str | None, *, what: str,
                     max_bytes: int = MAX_JSON_BYTES) -> dict[str, JSON]:
    """A JSON file that must hold an object (a ``config.json``, a ``trainer_state.json``)."""
    data = read_json(path, key, what=what, max_bytes=max_bytes)
    if not isinstance(data, dict):
        raise InputError(Path(path), key, f"{what} must be a JSON object")
    return data


def json_or_none(path: str | Path) -> object:
    """The JSON in ``path`` read through :func:`read_json`, or ``None`` when it is missing or
    unreadable: for optional files whose absence the caller handles (a dtype hint)."""
    try:
        return read_json(path, None, what="JSON file")
    except InputError:
        return None


def iter_json_lines(
    path: str | Path, key: str | None, *, what: str, max_records: int | None = None,
    records_bound: str | None = None, max_bytes: int | None = None, bound: str | None = None,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> Iterator[tuple[int, object]]:
    """``(line number, value)`` of each non-blank line of a JSON-lines file, one line held at
    a time. A line over ``max_line_bytes`` (refused before it is held), not UTF-8, nested too
    deep or not JSON, and a record past ``max_records``, is :class:`InputError` naming the
    file, ``key`` and the line (``records_bound`` names the count's constant or config key)."""
    path = check_input(path, key, what=what, max_bytes=max_bytes, bound=bound)
    count = 0
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise InputError(path, key, f"cannot read {what}: {exc.strerror or exc}") from None
    with handle:
        for number in itertools.count(1):
            line = handle.readline(max_line_bytes + 1)
            if not line:
                return
            where = f"line {number}" if key is None else f"{key}: line {number}"
            if len(line) > max_line_bytes and not line.endswith(b"\n"):
                raise InputError(path, where, f"a line longer than {max_line_bytes} bytes "
                                              "(MAX_LINE_BYTES); refused before holding it")
            if not line.strip():
                continue
            count += 1
            if max_records is not None and count > max_records:
                raise InputError(path, key, f"{what} holds more than {max_records} records "
                                            f"({records_bound or 'the bound'})")
            yield number, parse_json(line, path, where, what="line")


def read_json_lines(path: str | Path, key: str | None, *, what: str,
                    max_records: int, records_bound: str) -> list[tuple[int, object]]:
    """Every ``(line number, value)`` of a JSON-lines file (:func:`iter_json_lines`), at most
    ``max_records`` of them."""
    return list(iter_json_lines(path, key, what=what, max_records=max_records,
                                records_bound=records_bound))


def parse_yaml(text: str, path: Path, key: str | None = None) -> object:
    """The YAML document of ``text`` (libyaml where installed, which bounds block and flow
    nesting itself): composed into nodes, depth and alias expansion bounded
    (:data:`MAX_NESTING_DEPTH`, :data:`MAX_YAML_ALIAS_VALUES`), then constructed. A YAML
    error is :class:`InputError` naming the line."""
    import yaml

    loader_cls = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        loader = loader_cls(text)
        try:
            root = loader.get_single_node()
            _refuse_alias_bombs(root, path, key)
            return None if root is None else loader.construct_document(root)
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else None
        raise InputError(path, _join(key, where),
                         f"invalid YAML: {getattr(exc, 'problem', None) or exc}") from None
    except RecursionError:
        raise InputError(path, key, f"YAML nests deeper than {MAX_NESTING_DEPTH} levels "
                                    "(MAX_NESTING_DEPTH)") from None


def read_yaml(path: str | Path, key: str | None, *, what: str, max_bytes: int,
              bound: str) -> object:
    """A YAML file (UTF-8, at most ``max_bytes``) parsed by :func:`parse_yaml`."""
    from paritygate.reading import read_text

    text = read_text(path, key, what=what, max_bytes=max_bytes, bound=bound)
    return parse_yaml(text, Path(path), key)


def _join(key: str | None, where: str | None) -> str | None:
    return f"{key}: {where}" if key and where else key or where


def _refuse_alias_bombs(root: object, path: Path, key: str | None) -> None:
    """Refuse a document nesting deeper than :data:`MAX_NESTING_DEPTH` or whose aliases add
    more than :data:`MAX_YAML_ALIAS_VALUES` values. Each node's expanded size is memoised (the
    count stays linear in the file); what aliases add is the expanded size less the distinct
    nodes, zero without aliases; checked at every node, so a bomb is refused at its anchor."""
    import yaml

    sizes: dict[int, int] = {}

    def size(node: yaml.Node, depth: int) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        if depth > MAX_NESTING_DEPTH:
            raise InputError(path, _join(key, _line(node)), f"YAML nests deeper than "
                             f"{MAX_NESTING_DEPTH} levels (MAX_NESTING_DEPTH)")
        total = 1
        if isinstance(node, yaml.MappingNode):
            total += sum(size(k, depth + 1) + size(v, depth + 1) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            total += sum(size(v, depth + 1) for v in node.value)
        sizes[id(node)] = total
        if total - len(sizes) > MAX_YAML_ALIAS_VALUES:
            raise InputError(
                path, _join(key, _line(node)), f"YAML aliases expand to more than "
                f"{MAX_YAML_ALIAS_VALUES} values beyond those written (nested anchors and "
                "aliases; MAX_YAML_ALIAS_VALUES); write the values out")
        return total

    if isinstance(root, yaml.Node):
        size(root, 0)


def _line(node: object) -> str | None:
    mark = getattr(node, "start_mark", None)
    return f"line {mark.line + 1}" if mark is not None else None
