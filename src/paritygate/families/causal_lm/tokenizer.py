"""Loading HF tokenizers (training and serving) and encoding probes with them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol, cast

from paritygate.engines.hf_loading import quiet_transformers, require_tokenizer_files
from paritygate.errors import InputError, shorten
from paritygate.families.causal_lm.probes import Probe
from paritygate.reading import read_text


class Tokenizer(Protocol):
    """What the gate reads of an HF tokenizer (``transformers.PreTrainedTokenizerBase``)."""

    pad_token_id: int | None
    bos_token: str | None
    bos_token_id: int | None
    eos_token: str | None
    eos_token_id: int | None
    padding_side: str
    truncation_side: str
    chat_template: str | None

    def get_vocab(self) -> dict[str, int]: ...

    def __len__(self) -> int: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str: ...

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]: ...

    def __call__(self, text: str, **kwargs: Any) -> Any: ...

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...


def load_tokenizer(
    directory: Path, chat_template: Path | None = None, *, trust_remote_code: bool = False
) -> Tokenizer:
    """An HF tokenizer from ``directory``, its chat template optionally replaced by a file."""
    from transformers import AutoTokenizer

    require_tokenizer_files(directory, None)
    try:
        with quiet_transformers():
            tok = AutoTokenizer.from_pretrained(directory, trust_remote_code=trust_remote_code)
    except Exception as exc:  # transformers raises many types for unreadable dirs
        raise InputError(directory, "tokenizer", f"cannot load tokenizer: {exc}") from None
    if chat_template is not None:
        tok.chat_template = read_text(chat_template, None, what="chat template",
                                      max_bytes=MAX_TEMPLATE_BYTES, bound="MAX_TEMPLATE_BYTES")
    loaded: Tokenizer = cast("Tokenizer", tok)  # an HF tokenizer satisfies the protocol
    return loaded


MAX_TEMPLATE_BYTES = 2**20
"""A chat template file is at most 1 MiB: real templates are a few KB (the longest, with tool
calling, under 20 KB), and a template is compiled and rendered for every chat probe."""

MAX_CHARS_PER_TOKEN = 64
"""A probe's text is cut to ``max_prompt_tokens`` times this many characters before it is
tokenized: far more than any token spans, so the kept tokens are the same, and a 200 MB
probe never reaches the tokenizer whole."""

TEMPLATE_TIME_LIMIT_S = 3.0
"""A chat template renders one probe in milliseconds; one still running after this long
(nested loops over large ranges) is stopped and reported as bad input."""


class TemplateTimeout(Exception):
    """A chat template ran past :data:`TEMPLATE_TIME_LIMIT_S`."""


@contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`TemplateTimeout` in the block after ``seconds`` (main thread, POSIX;
    elsewhere no limit)."""
    import signal
    import threading

    main = threading.current_thread() is threading.main_thread()
    if not hasattr(signal, "setitimer") or not main:
        yield
        return

    def expired(signum: int, frame: Any) -> None:
        raise TemplateTimeout(f"did not finish within {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def cut_probe(probe: Probe, max_tokens: int, side: str = "right") -> Probe:
    """``probe`` with its text (each message's content) cut to ``max_tokens`` *
    :data:`MAX_CHARS_PER_TOKEN` characters, on the tokenizer's truncation ``side``."""
    limit = max_tokens * MAX_CHARS_PER_TOKEN

    def cut(text: str) -> str:
        if len(text) <= limit:
            return text
        return text[-limit:] if side == "left" else text[:limit]

    if probe.messages is not None:
        messages = tuple(
            {**m, "content": cut(m["content"])} if isinstance(m.get("content"), str) else m
            for m in probe.messages
        )
        return replace(probe, messages=messages)
    return replace(probe, text=cut(probe.text or ""))


def is_cut(probe: Probe, max_tokens: int) -> bool:
    """Whether :func:`cut_probe` shortens ``probe``."""
    limit = max_tokens * MAX_CHARS_PER_TOKEN
    if probe.messages is not None:
        return any(isinstance(m.get("content"), str) and len(m["content"]) > limit
                   for m in probe.messages)
    return len(probe.text or "") > limit


def _apply_template(tokenizer: Any, probe: Probe, *, tokenize: bool) -> Any:
    """The chat template on ``probe``, bounded in time; any failure of the template (the
    sandbox refusing it, a syntax error, a runtime error, memory, time) is bad input naming
    the probe. The caller adds the template's file and config key."""
    try:
        with _time_limit(TEMPLATE_TIME_LIMIT_S):
            kwargs = {"return_dict": False} if tokenize else {}
            return tokenizer.apply_chat_template(
                list(probe.messages or ()), add_generation_prompt=True, tokenize=tokenize,
                **kwargs,
            )
    except (Exception, MemoryError, RecursionError, TemplateTimeout) as exc:
        raise InputError(
            None, f"probe {probe.id!r}",
            f"chat template failed: {type(exc).__name__}: {shorten(str(exc), 200)}",
        ) from None


def encode_probe(tokenizer: Any, probe: Probe, max_tokens: int) -> list[int]:
    """Token ids of a probe as a prompt: plain text with special tokens, or the chat template
    with the generation prompt; truncated to ``max_tokens`` on the tokenizer's truncation side
    (the text is cut by characters first, :func:`cut_probe`)."""
    side = getattr(tokenizer, "truncation_side", "right")
    probe = cut_probe(probe, max_tokens, side)
    if probe.messages is not None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"probe {probe.id!r} is a chat but the tokenizer has no chat template")
        ids = list(_apply_template(tokenizer, probe, tokenize=True))
    else:
        # verbose=False: a cut text may still exceed the model's length before the cut below
        ids = list(tokenizer(probe.text or "", add_special_tokens=True, verbose=False)["input_ids"])
    if len(ids) > max_tokens:
        ids = ids[-max_tokens:] if side == "left" else ids[:max_tokens]
    return ids


def render_probe(tokenizer: Any, probe: Probe, max_tokens: int | None = None) -> str:
    """The prompt text a probe becomes (chat template applied for chats); cut as
    :func:`encode_probe` cuts it when ``max_tokens`` is given."""
    if max_tokens is not None:
        probe = cut_probe(probe, max_tokens, getattr(tokenizer, "truncation_side", "right"))
    if probe.messages is not None:
        return str(_apply_template(tokenizer, probe, tokenize=False))
    return probe.text or ""


def template_file(directory: Path, override: Path | None) -> Path:
    """The file a tokenizer's chat template comes from, for error lines."""
    if override is not None:
        return override
    jinja = directory / "chat_template.jinja"
    return jinja if jinja.is_file() else directory / "tokenizer_config.json"
