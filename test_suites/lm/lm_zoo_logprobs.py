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


def _reference_logits(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Any:
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        return model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
        ).logits.float()  # (B, T, V)


def temperature_ignored(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, **_: Any
) -> torch.Tensor:
    """Accepts temperature and mode, but always scores the plain softmax."""
    logp = torch.log_softmax(_reference_logits(model, input_ids, attention_mask)[:, :-1], -1)
    out = logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return out * (attention_mask[:, 1:] * attention_mask[:, :-1])


def prompt_only_mask(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kw: Any
) -> torch.Tensor:
    """Masks only the left pads before the prompt: right pads after EOS are scored."""
    logits = _reference_logits(model, input_ids, attention_mask)
    t = kw.get("temperature", 1.0) if kw.get("mode") == "processed" else 1.0
    logp = torch.log_softmax(logits[:, :-1] / t, -1)
    out = logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    started = (attention_mask.cumsum(-1) > 0).long()  # 1 from the prompt's first token on
    return out * (started[:, 1:] * started[:, :-1])


def off_by_one_next(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kw: Any
) -> torch.Tensor:
    """``logits[:, 1:]`` scored against ``input_ids[:, 1:]``."""
    t = kw.get("temperature", 1.0) if kw.get("mode") == "processed" else 1.0
    logits = _reference_logits(model, input_ids, attention_mask)
    logp = torch.log_softmax(logits[:, 1:] / t, -1)
    out = logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return out * (attention_mask[:, 1:] * attention_mask[:, :-1])


def no_position_ids(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kw: Any
) -> torch.Tensor:
    """Correct except that position ids are left to the model (TRL/verl style): RoPE starts
    at the pad count of each left-padded row."""
    with torch.inference_mode():
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits.float()
    t = kw.get("temperature", 1.0) if kw.get("mode") == "processed" else 1.0
    logp = torch.log_softmax(logits[:, :-1] / t, -1)
    out = logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return out * (attention_mask[:, 1:] * attention_mask[:, :-1])


def trl_style_logits(
    logits: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor,
    temperature: float,
) -> torch.Tensor:
    """Clean logits-level adapter in TRL's style: temperature-scaled logits of positions
    0..T-2, gathered at the next tokens, masked by the completion+prompt attention mask."""
    scores = logits[:, :-1, :] / temperature
    picked = scores.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    logp = picked - torch.logsumexp(scores, dim=-1)
    return logp * (attention_mask[:, 1:] * attention_mask[:, :-1])


def mask_not_passed(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kw: Any
) -> torch.Tensor:
    """Positions from the mask and pads zeroed in the output, but the forward gets no mask:
    real tokens attend to the left pads, so their log-probs move with the padding."""
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        logits = model(input_ids=input_ids, position_ids=position_ids).logits.float()
    t = kw.get("temperature", 1.0) if kw.get("mode") == "processed" else 1.0
    logp = torch.log_softmax(logits[:, :-1] / t, dim=-1)  # (B, T-1, V)
    out = logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)  # (B, T-1)
    return out * attention_mask[:, 1:]


REPETITION_PENALTY = 1.3
"""The penalty :func:`repetition_penalised` applies (the zoo's penalty variants serve it)."""


def repetition_penalised(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kw: Any
) -> torch.Tensor:
    """Correct log-probs of the penalised distribution an engine samples under
    ``repetition_penalty: 1.3``: at each position the logits of the tokens already in the
    sequence (prompt and completion so far, pads left out as vLLM has none) are divided by the
    penalty where positive and multiplied where negative (HF's and vLLM's rule), then the
    temperature applies."""
    logits = _reference_logits(model, input_ids, attention_mask)[:, :-1]  # (B, T-1, V)
    real = torch.nn.functional.one_hot(input_ids, logits.shape[-1]).bool()  # (B, T, V)
    real &= attention_mask.bool().unsqueeze(-1)
    seen = real.cummax(dim=1).values[:, :-1]  # (B, T-1, V): in the sequence up to position t
    penalised = torch.where(logits > 0, logits / REPETITION_PENALTY, logits * REPETITION_PENALTY)
    logits = torch.where(seen, penalised, logits)
    t = kw.get("temperature", 1.0) if kw.get("mode") == "processed" else 1.0
    logp = torch.log_softmax(logits / t, dim=-1)
    out = logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)  # (B, T-1)
    return out * (attention_mask[:, 1:] * attention_mask[:, :-1])
