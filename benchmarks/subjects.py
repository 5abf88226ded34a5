"""The benchmarks' own LM subjects: a tokenizer trained on the demo corpus, a sampling
generation config, and saving a model built from its config beside its tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def corpus_tokenizer() -> tuple[list[str], Any]:
    """The demo corpus' non-empty lines and a BPE tokenizer trained on them (seeded torch)."""
    import torch

    from paritygate.demo.causal_lm import CORPUS, _train_tokenizer

    torch.manual_seed(0)
    lines = [ln.strip() for ln in CORPUS.read_text(encoding="utf-8").splitlines() if ln.strip()]
    return lines, _train_tokenizer(lines)


def save_subject(model: Any, tok: Any, directory: Path, max_new_tokens: int) -> None:
    """``model`` with a plain sampling generation config (temperature 1, no top-k/top-p),
    saved with its tokenizer through ``save_pretrained``."""
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
        max_new_tokens=max_new_tokens)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
