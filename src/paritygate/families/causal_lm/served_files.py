"""The served directory's own files: the serving defaults, and declarations that contradict them.

Every serving-side input has one source by default, the directory that ships
(``serving.model_dir``, else ``model_dir``):

- sampling: its ``generation_config.json``;
- tokenizer: its tokenizer files (``tokenizer.json``, ``tokenizer_config.json``, ...), compared
  as loaded tokenizers (vocabulary, special ids, sides, template, the probes' token ids);
- chat template: its ``chat_template.jinja`` (or ``tokenizer_config.json``'s ``chat_template``);
- dtype: its ``config.json`` ``dtype`` (``torch_dtype`` before transformers 4.56).

A serving file the config declares elsewhere (``sampling.serving``, ``tokenizer.serving``,
``tokenizer.serving_chat_template``) that differs from the served directory's own file of
that kind is a contradiction: the served engine reads the files of the directory it serves,
so the gate would judge a serving setup that does not ship. Each one is recorded by the check
that reads that input (``sampling_config``, ``tokenizer_parity``) as
``serving_file_contradicts_served_dir``, naming both files and the fields that differ. A dtype
is an engine setting (vLLM ``--dtype``), not a file: a declared one overrides the served
``config.json``'s and is noted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paritygate.errors import InputError
from paritygate.reading import read_text
from paritygate.reading_text import json_or_none

TOKENIZER_FILE_NAMES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.txt", "vocab.json", "merges.txt", "tokenizer.model", "spiece.model",
    "sentencepiece.bpe.model", "chat_template.jinja", "chat_template.json",
)  # fmt: skip
"""Files that make a saved tokenizer (and its chat template)."""

_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


@dataclass(frozen=True)
class Contradiction:
    """A declared serving file that differs from the served directory's own file."""

    part: str
    """``sampling config``, ``tokenizer`` or ``chat template``."""
    key: str
    """The config key that declares the file."""
    declared: Path
    served: Path
    fields: tuple[str, ...]
    """The fields (or files, for a tokenizer directory) whose values differ."""

    def message(self) -> str:
        return (
            f"the declared serving {self.part} {self.declared} ({self.key}) contradicts the "
            f"served directory's own {self.served} (differing: {', '.join(self.fields[:8])}); the "
            f"served engine reads the directory it serves: remove {self.key} (the served "
            f"directory's own file is the default) or ship the file you declared"
        )


def served_dtype(served_dir: Path) -> str | None:
    """The dtype the served directory's ``config.json`` states (``dtype``, else
    ``torch_dtype``), ``None`` when it states none this gate knows."""
    config = json_or_none(served_dir / "config.json")
    if not isinstance(config, dict):
        return None
    value = config.get("dtype") or config.get("torch_dtype")
    return _DTYPES.get(str(value).replace("torch.", "")) if value else None


def _json(path: Path) -> Any:
    return json_or_none(path)


def has_tokenizer(directory: Path) -> bool:
    """The directory ships a tokenizer of its own (a template alone is none)."""
    return any((directory / n).is_file() for n in TOKENIZER_FILE_NAMES
               if not n.startswith("chat_template"))


def tokenizer_fields(
    declared: Any, own: Any, encode: Callable[[Any], list[list[int]]]
) -> list[str]:
    """What a declared tokenizer does differently from the served directory's own, compared
    as loaded tokenizers (files re-saved by another version compare equal): vocabulary,
    special token ids, padding and truncation side, chat template, and the probes' token ids
    (``encode(tokenizer)``)."""
    fields = []
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "padding_side",
                 "truncation_side", "chat_template"):
        theirs, ours = getattr(declared, name, None), getattr(own, name, None)
        if (theirs or None) != (ours or None):
            fields.append(name if name == "chat_template" else f"{name} {theirs!r} vs {ours!r}")
    if declared.get_vocab() != own.get_vocab():
        fields.append("vocabulary")
    if encode(declared) != encode(own):
        fields.append("probe token ids")
    return fields


def own_chat_template(tokenizer_dir: Path) -> tuple[Path, str] | None:
    """The chat template a tokenizer directory ships, and the file it is in."""
    jinja = tokenizer_dir / "chat_template.jinja"
    if jinja.is_file():
        try:
            return jinja, read_text(jinja, None, what="chat template")
        except InputError:
            return None
    config = _json(tokenizer_dir / "tokenizer_config.json")
    if isinstance(config, dict) and isinstance(config.get("chat_template"), str):
        return tokenizer_dir / "tokenizer_config.json", str(config["chat_template"])
    return None


def chat_template_contradiction(
    declared: Path, key: str, served_dir: Path
) -> Contradiction | None:
    """A declared serving chat template file that differs from the template the served
    directory ships (``None`` when it ships none, or the same text)."""
    found = own_chat_template(served_dir)
    if found is None:
        return None
    path, text = found
    try:
        theirs = read_text(declared, key, what="chat template")
    except InputError:
        return None  # unreadable: loading the tokenizer reports it
    if declared.resolve() == path.resolve() or theirs.strip() == text.strip():
        return None
    return Contradiction("chat template", key, declared, path, ("chat_template",))


def sampling_contradiction(
    declared: Any, own: Any, key: str
) -> Contradiction | None:
    """A declared HF generation config (a normalised
    :class:`~paritygate.families.causal_lm.sampling.SamplingFile`) whose compared fields
    differ from the served directory's own ``generation_config.json`` (``own``, read the same
    way). A vLLM sampling-parameters file is the request's parameters, which override the
    generation config by design: never a contradiction."""
    if declared.format != "hf_generation_config":
        return None
    if declared.path.resolve() == own.path.resolve():
        return None
    fields = tuple(
        f"{name} {declared.values.get(name)!r} vs {own.values.get(name)!r}"
        for name in declared.compared_fields
        if declared.values.get(name) != own.values.get(name)
    )
    if not fields:
        return None
    return Contradiction("sampling config", key, declared.path, own.path, fields)
