"""Training-side log-prob functions written the way real RL trainers write them.

Each is a model-level ``logprob_fn`` as a user plugs it into ``causal_lm.training.logprob_fn``
when gating a trainer's own recompute. They call the model as the trainer does: with
``input_ids`` and ``attention_mask`` only, no ``position_ids``, so on a rotary model left
padding shifts positions by the pad count (rounding only). All are correct trainers: the gate
must pass them.

- ``trl_grpo``: TRL's own ``trl.trainer.utils.selective_log_softmax`` (the installed TRL), in
  the pattern of ``GRPOTrainer._get_per_token_logps_and_entropies`` (TRL 1.16): logits of
  positions 0..T-2, the sampling temperature passed to ``selective_log_softmax``, gathered at
  the next tokens, masked by the attention mask.
- ``trl_ppo``: TRL's PPO pattern: ``logits /= temperature + 1e-7``, then
  ``selective_log_softmax``.
- ``verl_response``: verl 0.9.1's ``log_probs_from_logits_response`` (``logits[:, -L-1:-1]``
  scored against ``input_ids[:, -L:]``) over ``logprobs_from_logits_naive``
  (``log_softmax`` + gather), after the actor's ``logits.div_(temperature)``. verl itself does
  not import without Ray, so its arithmetic is reproduced here, line for line.
"""

from __future__ import annotations

from typing import Any

import torch


def _temperature(kw: dict[str, Any]) -> float:
    return float(kw.get("temperature", 1.0)) if kw.get("mode") == "processed" else 1.0


def trl_grpo(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kw: Any) -> Any:
    from trl.trainer.utils import selective_log_softmax

    with torch.inference_mode():
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits  # (B, T, V)
        logits = logits[:, :-1, :]  # (B, T-1, V): position t predicts token t+1
        logps = selective_log_softmax(logits, input_ids[:, 1:], temperature=_temperature(kw))
    return logps * attention_mask[:, 1:]  # (B, T-1)


def trl_ppo(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kw: Any) -> Any:
    from trl.trainer.utils import selective_log_softmax

    with torch.inference_mode():
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]
        logits = logits / (_temperature(kw) + 1e-7)
        logps = selective_log_softmax(logits, input_ids[:, 1:])
    return logps * attention_mask[:, 1:]


def verl_response(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kw: Any
) -> Any:
    response_length = input_ids.shape[1] - 1
    with torch.inference_mode():
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        logits.div_(_temperature(kw))
        response_logits = logits[:, -response_length - 1 : -1]  # (B, L, V)
        response = input_ids[:, -response_length:]  # (B, L)
        logp = torch.log_softmax(response_logits, dim=-1)
        logpy = logp.gather(-1, response.unsqueeze(-1)).squeeze(-1)
    return logpy * attention_mask[:, 1:]


def trl_grpo_bf16(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kw: Any
) -> Any:
    """A real bug in the same code: the logits go to ``selective_log_softmax`` in bfloat16
    (its row-wise ``log_softmax`` path then runs in bf16)."""
    from trl.trainer.utils import selective_log_softmax

    with torch.inference_mode():
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]
        logps = selective_log_softmax(
            logits.to(torch.bfloat16), input_ids[:, 1:], temperature=_temperature(kw)
        )
    return logps.float() * attention_mask[:, 1:]
