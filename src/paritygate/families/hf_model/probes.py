"""Probe inputs of the hf_model family, as batches of integer token tensors.

Text probes (``.txt``, one text a line; ``.jsonl``, objects with ``text``) are
tokenized by the model directory's tokenizer, truncated to ``max_tokens`` and
padded per batch. An ``.npz`` gives the ids directly (``input_ids``, optional
``attention_mask`` and ``token_type_ids``, all integer). Ids stay integer: the
low-precision passes cast floating tensors only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from paritygate.errors import InputError
from paritygate.reading import load_arrays, read_text
from paritygate.reading_text import MAX_JSON_BYTES, parse_json

Batch = tuple[tuple[Any, ...], dict[str, Any]]
NPZ_KEYS = ("input_ids", "attention_mask", "token_type_ids")


def read_texts(path: Path) -> list[str]:
    """Texts of a ``.txt`` (non-empty lines) or ``.jsonl`` (``{"text": ...}``) probe file."""
    lines = read_text(path, "hf_model.probes", what="probes file", max_bytes=MAX_JSON_BYTES,
                      bound="MAX_JSON_BYTES").splitlines()
    if path.suffix != ".jsonl":
        texts = [line for line in lines if line.strip()]
    else:
        texts = []
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            obj = parse_json(line, path, f"line {number}", what="line")
            if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
                raise InputError(path, f"line {number}.text", "each line needs a string 'text'")
            texts.append(obj["text"])
    if not texts:
        raise InputError(path, "hf_model.probes", "no probe texts")
    return texts


def text_batches(
    tokenizer: Any, texts: list[str], max_tokens: int, batch_size: int, path: Path | None = None
) -> list[Batch]:
    """Tokenized, truncated batches, padded to the longest text of each batch.

    A tokenizer without a pad token (GPT-2's) pads with its EOS token, or UNK: padded
    positions are masked, and the low-precision passes see the same ids as fp32."""
    if tokenizer.pad_token is None:
        fill = tokenizer.eos_token or tokenizer.unk_token
        if fill is None and len(texts) > 1 and batch_size > 1:
            raise InputError(
                path, "hf_model.batch_size", "the tokenizer has no pad, EOS or UNK token to pad "
                "texts of different lengths with: set batch_size: 1 or give .npz probes"
            )
        tokenizer.pad_token = fill
    batches: list[Batch] = []
    for start in range(0, len(texts), batch_size):
        try:
            enc = tokenizer(
                texts[start : start + batch_size],
                padding=True,
                truncation=True,
                max_length=max_tokens,
                return_tensors="pt",
            )
        except Exception as exc:  # transformers raises ValueError, TypeError, ...
            raise InputError(
                path, "hf_model.probes", f"the tokenizer cannot encode probe {start + 1}: {exc}"
            ) from None
        batches.append(((), {k: v for k, v in enc.items() if k in NPZ_KEYS}))
    return batches


def npz_batches(path: Path, vocab_size: int | None, batch_size: int) -> list[Batch]:
    """Batches of the integer arrays in an ``.npz`` probe file."""
    import torch

    data = load_arrays(path, "hf_model.probes", what="probes file")
    if not isinstance(data, dict):
        raise InputError(path, "hf_model.probes", "probes must be an .npz of named arrays")
    arrays = {k: np.asarray(data[k]) for k in NPZ_KEYS if k in data}
    ids = arrays.get("input_ids")
    if ids is None:
        raise InputError(path, "input_ids", "the .npz has no input_ids array")
    for key, arr in arrays.items():
        if not np.issubdtype(arr.dtype, np.integer) or arr.ndim != 2 or arr.shape != ids.shape:
            raise InputError(
                path,
                key,
                f"must be an integer (N, T) array like input_ids, got {arr.dtype} {arr.shape}",
            )
    if ids.size == 0:
        raise InputError(path, "input_ids", "no probe sequences")
    if ids.min() < 0 or (vocab_size is not None and ids.max() >= vocab_size):
        raise InputError(
            path, "input_ids", f"ids must lie in [0, {vocab_size}) (got {ids.min()}..{ids.max()})"
        )
    arrays.setdefault("attention_mask", np.ones_like(ids))
    return [
        (
            (),
            {
                k: torch.from_numpy(v[start : start + batch_size].astype(np.int64))
                for k, v in arrays.items()
            },
        )
        for start in range(0, len(ids), batch_size)
    ]
