"""KL terms and reference log-prob functions written the way RL trainers write them.

- ``trl_grpo_kl``: TRL GRPO's ``per_token_kl`` (``GRPOTrainer._compute_loss``): with
  ``ref_per_token_logps`` and ``per_token_logps``, ``exp(ref - logp) - (ref - logp) - 1``. A
  correct trainer: the gate must pass it.
- ``k1_plain``: ``logp - logp_ref`` (correct, unbiased k1).
- ``kl_sign_flipped``: k1 written ``logp_ref - logp``: the penalty pushes away from the reference.
- ``k3_swapped``: k3 with the arguments swapped, ``exp(logp - ref) - (logp - ref) - 1``.
- ``k3_no_minus_one``: k3 without its ``- 1`` (a wrong k3 form).
- ``ref_logprobs_no_mask``: a reference forward without the attention mask, every position
  scored (pads too).
- ``kl_mean``: returns one number for the batch, neither per token nor per sequence.
- ``trl_seq_k3``: k3 reduced per sequence the TRL/verl way, ``(k * mask).sum(-1) /
  mask.sum(-1)`` (correct); ``seq_k3_sum``: the masked sum (correct under ``kl_reduction: sum``).
- ``seq_k3_mask_ignored``: ``k.mean(-1)``, pads counted; ``seq_k3_mean_over_pads``:
  ``(k * mask).sum(-1) / k.shape[-1]``.
"""

from __future__ import annotations

from typing import Any

import torch


def trl_grpo_kl(logp: torch.Tensor, logp_ref: torch.Tensor, mask: Any) -> torch.Tensor:
    ref_per_token_logps, per_token_logps = logp_ref, logp
    return (torch.exp(ref_per_token_logps - per_token_logps)
            - (ref_per_token_logps - per_token_logps) - 1)


def k1_plain(logp: torch.Tensor, logp_ref: torch.Tensor, mask: Any) -> torch.Tensor:
    return logp - logp_ref


def kl_sign_flipped(logp: torch.Tensor, logp_ref: torch.Tensor, mask: Any) -> torch.Tensor:
    return logp_ref - logp


def k3_swapped(logp: torch.Tensor, logp_ref: torch.Tensor, mask: Any) -> torch.Tensor:
    return torch.exp(logp - logp_ref) - (logp - logp_ref) - 1


def k3_no_minus_one(logp: torch.Tensor, logp_ref: torch.Tensor, mask: Any) -> torch.Tensor:
    return torch.exp(logp_ref - logp) - (logp_ref - logp)


def kl_mean(logp: torch.Tensor, logp_ref: torch.Tensor, mask: Any) -> torch.Tensor:
    return (logp - logp_ref).mean()


def _k3(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    return torch.exp(logp_ref - logp) - (logp_ref - logp) - 1


def trl_seq_k3(logp: torch.Tensor, logp_ref: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    per_token_kl = _k3(logp, logp_ref)
    return (per_token_kl * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)


def seq_k3_sum(logp: torch.Tensor, logp_ref: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (_k3(logp, logp_ref) * mask).sum(-1)


def seq_k3_mask_ignored(logp: torch.Tensor, logp_ref: torch.Tensor, mask: Any) -> torch.Tensor:
    return _k3(logp, logp_ref).mean(-1)


def seq_k3_mean_over_pads(logp: torch.Tensor, logp_ref: torch.Tensor, mask: torch.Tensor,
                          ) -> torch.Tensor:
    return (_k3(logp, logp_ref) * mask).sum(-1) / logp.shape[-1]


def kl_two_args(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    return logp - logp_ref


def ref_logprobs_no_mask(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kw: Any
) -> torch.Tensor:
    with torch.inference_mode():
        logits = model(input_ids=input_ids).logits[:, :-1].float()  # (B, T-1, V)
        logp = torch.log_softmax(logits, dim=-1)
        return logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)  # (B, T-1)
