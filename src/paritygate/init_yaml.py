"""The YAML document ``paritygate init`` writes, built through ruamel.yaml.

A config is a tree of :class:`Block` mappings (ruamel ``CommentedMap``): each value is set with
its end-of-line note, and comment lines (a hint, a commented-out key to uncomment) attach
before the next key written, at their own indent. The text is produced once, by the library's
emitter, so every value is quoted as YAML needs and every TODO stays a value that
:func:`paritygate.init_infer.find_todos` finds; no line of text is ever edited.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from paritygate.init_infer import TODO

if TYPE_CHECKING:
    from ruamel.yaml.comments import CommentedMap

__all__ = ["Block", "ConfigDoc", "flow", "todo_value"]


def todo_value(what: str) -> str:
    """``"TODO: what"``, double-quoted in the YAML, so the whole value is one string to
    replace and the loader refuses it until then."""
    from ruamel.yaml.scalarstring import DoubleQuotedScalarString

    return DoubleQuotedScalarString(f"{TODO}: {what}")


def flow(value: object) -> object:
    """``value`` (lists, dicts, scalars) as ruamel nodes in flow style: ``[64, 64]``,
    ``{pi: [64], vf: [32]}``; scalars unchanged."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    if isinstance(value, Mapping):
        node = CommentedMap((str(k), flow(v)) for k, v in value.items())
        node.fa.set_flow_style()
        return node
    if isinstance(value, Sequence) and not isinstance(value, str):
        seq = CommentedSeq(flow(v) for v in value)
        seq.fa.set_flow_style()
        return seq
    return value


class ConfigDoc:
    """One config being written: its root :class:`Block` and the comment lines waiting for
    the next key."""

    def __init__(self, header: Sequence[str] = ()) -> None:
        from ruamel.yaml.comments import CommentedMap

        self.data = CommentedMap()
        self.pending: list[tuple[int, str]] = []
        self.root = Block(self, self.data, 0)
        if header:
            self.data.yaml_set_start_comment("\n".join(header))

    def dump(self) -> str:
        """The document as YAML text (comment lines still pending are an error: every
        comment precedes a key)."""
        from ruamel.yaml import YAML

        if self.pending:
            raise ValueError(f"comment lines after the last key: {self.pending}")
        yaml = YAML()
        yaml.width = 4096  # a long TODO stays on its key's line
        yaml.indent(mapping=2, sequence=4, offset=2)
        yaml.representer.add_representer(  # ``key: null``, never a bare ``key:``
            type(None), lambda rep, _: rep.represent_scalar("tag:yaml.org,2002:null", "null"))
        buffer = io.StringIO()
        yaml.dump(self.data, buffer)
        return buffer.getvalue()


class Block:
    """A mapping of the config (``policy``, ``causal_lm.serving``...) at its indent."""

    def __init__(self, doc: ConfigDoc, data: CommentedMap, indent: int) -> None:
        self.doc = doc
        self.data = data
        self.indent = indent

    def set(self, key: str, value: object, note: str | None = None, *,
            block: bool = False) -> None:
        """``key: value   # note``. Lists and dicts are written in flow style unless
        ``block`` (a list of mappings, one per line)."""
        self._before(key)
        self.data[key] = value if block else flow(value)
        if note:
            self.data.yaml_add_eol_comment(note, key)

    def todo(self, key: str, what: str, note: str | None = None) -> None:
        """``key: "TODO: what"``: a value the user must give; the config is refused until then."""
        self.set(key, todo_value(what), note)

    def block(self, key: str, note: str | None = None) -> Block:
        """A nested mapping under ``key`` (written as a block), to fill."""
        from ruamel.yaml.comments import CommentedMap

        self._before(key)
        child = CommentedMap()
        self.data[key] = child
        if note:
            self.data.yaml_add_eol_comment(note, key)
        return Block(self.doc, child, self.indent + 2)

    def child(self, key: str) -> Block:
        """The nested mapping already under ``key``."""
        return Block(self.doc, self.data[key], self.indent + 2)

    def comment(self, *lines: str, indent: int | None = None) -> None:
        """Comment lines written before the next key set in the document (at this block's
        indent unless ``indent``)."""
        at = self.indent if indent is None else indent
        self.doc.pending += [(at, line) for line in lines]

    def insert_after(self, after: str, key: str, value: object, note: str | None = None) -> None:
        """``key: value`` placed right after ``after`` (an existing key)."""
        position = list(self.data).index(after) + 1
        self.data.insert(position, key, flow(value), comment=note)

    def _before(self, key: str) -> None:
        for indent, line in self.doc.pending:
            self.data.yaml_set_comment_before_after_key(key, before=line, indent=indent)
        self.doc.pending = []
