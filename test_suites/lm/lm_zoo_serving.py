"""Serving loops' batch layouts for the batch_invariance zoo (``causal_lm.engine.collate``).

Each is what a hand-written serving loop passes to an HF model for a batch of prompts; the
faulty ones reproduce a real mistake, the model itself is untouched.
"""

from __future__ import annotations

from typing import Any

from paritygate.engines.batching import collate_padded


def positions_not_from_mask(rows: list[list[int]], pad_token_id: int,
                            padding_side: str) -> dict[str, Any]:
    """Left-padded with the mask, but no position ids: the model counts 0..T-1 over the padded
    row, so a row's positions shift by its padding (``model(input_ids, attention_mask)``)."""
    batch = collate_padded(rows, pad_token_id, "left")
    return {**batch, "position_ids": None}


def mask_not_passed(rows: list[list[int]], pad_token_id: int,
                    padding_side: str) -> dict[str, Any]:
    """Left-padded with positions from the mask, but the mask is not passed on: every row
    attends to its pads."""
    batch = collate_padded(rows, pad_token_id, "left")
    return {**batch, "attention_mask": None}


def right_padded(rows: list[list[int]], pad_token_id: int, padding_side: str) -> dict[str, Any]:
    """Pads after the tokens whatever the tokenizer says (a collator written for training)."""
    return collate_padded(rows, pad_token_id, "right")
