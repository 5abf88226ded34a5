"""Loading HF tokenizers (training and serving) and encoding probes with them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from paritygate.engines.hf_loading import quiet_transformers, require_tokenizer_files
from paritygate.errors import InputError
from paritygate.families.causal_lm.probes import Probe


def load_tokenizer(
    directory: Path, chat_template: Path | None = None, *, trust_remote_code: bool = False
) -> Any:
    """An HF tokenizer from ``directory``, its chat template optionally replaced by a file."""
    from transformers import AutoTokenizer

    require_tokenizer_files(directory, None)
    try:
        with quiet_transformers():
            tok = AutoTokenizer.from_pretrained(directory, trust_remote_code=trust_remote_code)
    except Exception as exc:  # transformers raises many types for unreadable dirs
        raise InputError(directory, "tokenizer", f"cannot load tokenizer: {exc}") from None
    if chat_template is not None:
        try:
            tok.chat_template = chat_template.read_text(encoding="utf-8")
        except OSError as exc:
            raise InputError(chat_template, None, f"cannot read chat template: {exc}") from None
    return tok


def encode_probe(tokenizer: Any, probe: Probe, max_tokens: int) -> list[int]:
    """Token ids of a probe as a prompt: plain text with special tokens, or the chat template
    with the generation prompt; truncated to ``max_tokens`` on the tokenizer's truncation side."""
    if probe.messages is not None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"probe {probe.id!r} is a chat but the tokenizer has no chat template")
        ids = list(
            tokenizer.apply_chat_template(
                list(probe.messages), add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )
    else:
        ids = list(tokenizer(probe.text or "", add_special_tokens=True)["input_ids"])
    if len(ids) > max_tokens:
        ids = ids[-max_tokens:] if tokenizer.truncation_side == "left" else ids[:max_tokens]
    return ids


def render_probe(tokenizer: Any, probe: Probe) -> str:
    """The prompt text a probe becomes (chat template applied for chats)."""
    if probe.messages is not None:
        return str(
            tokenizer.apply_chat_template(
                list(probe.messages), add_generation_prompt=True, tokenize=False
            )
        )
    return probe.text or ""
