"""Faulty training-side log-prob functions for the fault zoo (same signature as
:func:`paritygate.families.causal_lm.logprobs.compute_logprobs`)."""

from __future__ import annotations

from typing import Any

import torch


def pads_counted(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, **_: Any
) -> torch.Tensor:
    """Ignores the attention mask: pads are attended to and scored like real tokens."""
    with torch.inference_mode():
        logits = model(input_ids=input_ids).logits.float()  # (B, T, V)
    logp = torch.log_softmax(logits[:, :-1], dim=-1)  # (B, T-1, V)
    return logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)  # (B, T-1)


def off_by_one(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, **_: Any
) -> torch.Tensor:
    """Scores token t with the logits of position t (instead of token t+1)."""
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        logits = model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
        ).logits.float()  # (B, T, V)
    logp = torch.log_softmax(logits[:, :-1], dim=-1)  # (B, T-1, V)
    out = logp.gather(-1, input_ids[:, :-1].unsqueeze(-1)).squeeze(-1)  # (B, T-1)
    return out * (attention_mask[:, 1:] * attention_mask[:, :-1])
