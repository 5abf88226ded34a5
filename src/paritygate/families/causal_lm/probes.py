"""Probe prompts of the causal-LM family: a JSONL file, one prompt per line."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paritygate.errors import InputError
from paritygate.reading import read_text
from paritygate.reading_text import MAX_JSON_BYTES, parse_json


@dataclass(frozen=True)
class Probe:
    """A plain-text prompt (``text``) or a chat (``messages``); exactly one is set."""

    id: str
    text: str | None = None
    messages: tuple[dict[str, str], ...] | None = None

    @property
    def is_chat(self) -> bool:
        return self.messages is not None


def _parse(obj: Any, where: str, path: Path) -> Probe:
    if not isinstance(obj, dict):
        raise InputError(path, where, "each line must be a JSON object")
    unknown = set(obj) - {"id", "text", "messages", "kind"}
    if unknown:
        raise InputError(path, f"{where}.{sorted(unknown)[0]}", "unknown key")
    pid = obj.get("id")
    if not isinstance(pid, str) or not pid:
        raise InputError(path, f"{where}.id", "required non-empty string")
    if ("text" in obj) == ("messages" in obj):
        raise InputError(path, where, f"probe {pid!r} needs exactly one of 'text' or 'messages'")
    if "text" in obj:
        if not isinstance(obj["text"], str):
            raise InputError(path, f"{where}.text", "must be a string")
        return Probe(pid, text=obj["text"])
    messages = obj["messages"]
    if not isinstance(messages, list) or not messages:
        raise InputError(path, f"{where}.messages", "must be a non-empty list")
    for i, m in enumerate(messages):
        if (
            not isinstance(m, dict)
            or set(m) != {"role", "content"}
            or not all(isinstance(v, str) for v in m.values())
        ):
            raise InputError(
                path, f"{where}.messages[{i}]", "must be {'role': str, 'content': str}"
            )
    return Probe(pid, messages=tuple(dict(m) for m in messages))


MAX_PROBES = 10_000
"""A probes file holds at most 10,000 probes: each is encoded by both tokenizers, generated,
teacher-forced and scored by several checks, and 10^4 probes already give per-token statistics
over ~10^6 tokens; a larger set belongs in a rollout dump."""


def load_probes(path: Path) -> list[Probe]:
    """Read and validate a probes file; raises :class:`InputError` naming the line."""
    lines = read_text(path, "causal_lm.probes", what="probes file", max_bytes=MAX_JSON_BYTES,
                      bound="MAX_JSON_BYTES").splitlines()
    probes: list[Probe] = []
    seen: set[str] = set()
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        obj = parse_json(line, path, f"line {n}", what="line")
        probe = _parse(obj, f"line {n}", path)
        if probe.id in seen:
            raise InputError(path, f"line {n}.id", f"duplicate probe id {probe.id!r}")
        seen.add(probe.id)
        probes.append(probe)
        if len(probes) > MAX_PROBES:
            raise InputError(path, None, f"more than {MAX_PROBES} probes (MAX_PROBES)")
    if not probes:
        raise InputError(path, None, "no probes")
    return probes
