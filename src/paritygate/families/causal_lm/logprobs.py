"""The training-side (reference) token log-prob function and its building blocks.

This is what a PPO/GRPO trainer computes when it recomputes the log-probs of a
rollout: a teacher-forced forward pass over ``prompt + response`` and the
log-softmax of each position's logits, read at the next token. The
``logprob_impl`` check proves these semantics; ``logprob_delta`` and
``vllm_delta`` compare the result with what the inference engine reported.

Conventions (all functions):

- Position ``t`` of the result scores token ``t + 1``: ``out[:, t] = log p(x[t+1] | x[<=t])``.
  The result has ``T - 1`` columns; token 0 is never scored (it has no context).
- A position counts only when both the target token ``t + 1`` and its context
  position ``t`` are real tokens (see :func:`target_mask`); every other entry is
  exactly ``0.0``.
- Left padding is supported: position ids are ``cumsum(mask) - 1`` clamped at 0,
  so the first real token always gets position 0 whatever the amount of padding.
- Everything is float32, whatever the model's dtype.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from types import ModuleType

    import torch
    from torch import nn

Mode = Literal["raw", "processed"]


@dataclass(frozen=True)
class TrainerLogprobs:
    """The trainer's log-prob function as the gate calls it (model level, guarded) and the
    reference implementation's building blocks that checks compare it with."""

    fn: Callable[..., torch.Tensor]
    name: str
    """``causal_lm.training.logprob_fn`` (``module:callable``)."""
    mode: str
    """``causal_lm.training.logprobs_mode``: raw or processed log-probs."""

    @property
    def helpers(self) -> ModuleType:
        """The reference implementation's building blocks (this module's functions)."""
        return sys.modules[__name__]


def target_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Which positions of a ``(B, T - 1)`` log-prob tensor are scored.

    Position ``t`` is scored when the target token ``t + 1`` is a real token
    (``attention_mask[:, t + 1] == 1``) and so is its context position ``t``.
    The second condition only matters for the first real token of a
    left-padded row: its logits would come from a pad position, whose output
    depends on how much padding there is, so it is excluded, exactly as token 0
    of an unpadded row is never scored.
    """
    mask = attention_mask.bool()  # (B, T)
    return mask[:, 1:] & mask[:, :-1]  # (B, T-1)


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """``cumsum(mask) - 1`` clamped at 0: left padding does not shift positions."""
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)  # (B, T)


def _check_processing(temperature: float, top_k: int | None, top_p: float | None) -> None:
    if not temperature > 0.0:
        raise ValueError(
            f"temperature must be > 0 for processed log-probs, got {temperature}; "
            "greedy decoding has no processed distribution, use mode='raw'"
        )
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


def process_logits(
    logits: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> torch.Tensor:
    """Apply temperature, then top-k, then top-p to ``(..., V)`` float logits.

    The order and the tie/boundary rules are those of Hugging Face's
    ``TemperatureLogitsWarper`` → ``TopKLogitsWarper`` → ``TopPLogitsWarper``
    and of vLLM's sampler (``processed_logprobs``):

    - temperature: ``logits / temperature`` (``temperature > 0``).
    - top-k (``None``, ``0`` or negative = off): keep every token whose logit is
      ``>=`` the k-th largest logit (ties at the boundary are kept); the rest
      get ``-inf``.
    - top-p (``None`` or ``1.0`` = off): sort the (temperature-scaled, top-k
      filtered) probabilities ascending, drop the tokens whose cumulative
      probability is ``<= 1 - top_p``; the most likely token is always kept. This
      keeps the smallest set of most likely tokens whose total mass is at least
      ``top_p``.
    """
    import torch

    _check_processing(temperature, top_k, top_p)
    out = logits.float()
    if temperature != 1.0:
        out = out / temperature
    vocab = out.shape[-1]
    if top_k is not None and 0 < top_k < vocab:
        kth = torch.topk(out, top_k, dim=-1).values[..., -1:]  # (..., 1)
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(out, dim=-1, descending=False)  # (..., V)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)  # (..., V)
        drop_sorted = cum <= 1.0 - top_p
        drop_sorted[..., -1] = False  # the most likely token always stays
        drop = drop_sorted.scatter(-1, sorted_idx, drop_sorted)
        out = out.masked_fill(drop, float("-inf"))
    return out


def logprobs_from_logits(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    mode: Mode = "raw",
) -> torch.Tensor:
    """Token log-probs from full-sequence logits: ``(B, T, V)`` -> ``(B, T - 1)`` float32.

    ``mode="raw"``: ``log_softmax(logits)`` read at the next token; the sampling
    arguments are ignored (this is vLLM's ``raw_logprobs``).
    ``mode="processed"``: ``log_softmax(process_logits(logits, ...))``; a target
    token removed by top-k/top-p gets ``-inf`` (it has probability 0 under the
    processed distribution), which the delta statistics count as non-finite.
    Unscored positions (:func:`target_mask`) are exactly 0.
    """
    import torch

    if mode not in ("raw", "processed"):
        raise ValueError(f"mode must be 'raw' or 'processed', got {mode!r}")
    if logits.dim() != 3 or logits.shape[:2] != input_ids.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} must be (B, T, V) for input_ids {tuple(input_ids.shape)}"
        )
    scores = logits[:, :-1, :].float()  # (B, T-1, V): position t predicts token t+1
    if mode == "processed":
        scores = process_logits(scores, temperature=temperature, top_k=top_k, top_p=top_p)
    logp_all = torch.log_softmax(scores, dim=-1)  # (B, T-1, V)
    targets = input_ids[:, 1:].long()  # (B, T-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (B, T-1)
    keep = target_mask(attention_mask).to(logp.device)  # (B, T-1)
    return torch.where(keep, logp, torch.zeros_like(logp))


def _logits_of(output: Any) -> torch.Tensor:
    logits = getattr(output, "logits", None)
    if logits is None and isinstance(output, (tuple, list)):
        logits = output[0]
    if logits is None:
        raise TypeError(f"model output {type(output).__name__} has no logits")
    return logits


def compute_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    mode: Mode = "raw",
) -> torch.Tensor:
    """The trainer's recompute: teacher-forced forward, then :func:`logprobs_from_logits`.

    ``input_ids`` and ``attention_mask`` are ``(B, T)`` (left or right padded).
    The model runs in eval mode (its previous mode is restored afterwards) under
    ``torch.inference_mode`` with ``position_ids = cumsum(mask) - 1`` clamped at
    0, and its logits are cast to float32 before the log-softmax. Returns
    ``(B, T - 1)`` float32 where ``out[:, t] = log p(input_ids[:, t + 1] | input_ids[:, :t + 1])``
    and unscored positions are 0.

    Sampling semantics (``mode="processed"`` only; ``raw`` ignores them):
    ``temperature`` divides the logits (must be > 0), then ``top_k`` keeps the
    tokens whose logit is at least the k-th largest (``None``/``0`` = off), then
    ``top_p`` keeps the smallest set of most likely tokens with total probability
    ``>= top_p`` (``None``/``1.0`` = off), as in HF's logits warpers and vLLM's
    ``processed_logprobs``. Repetition penalty and min-tokens EOS masking are not
    modelled.
    """
    import torch

    if input_ids.shape != attention_mask.shape or input_ids.dim() != 2:
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)} and attention_mask "
            f"{tuple(attention_mask.shape)} must both be (B, T)"
        )
    was_training = bool(getattr(model, "training", False))
    if hasattr(model, "eval"):
        model.eval()
    try:
        with torch.inference_mode():
            position_ids = position_ids_from_mask(attention_mask)  # (B, T)
            output = model(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
            )
            logits = _logits_of(output).float()  # (B, T, V)
            return logprobs_from_logits(
                logits,
                input_ids,
                attention_mask,
                temperature=temperature,
                top_k=top_k,
                top_p=top_p,
                mode=mode,
            )
    finally:
        if was_training and hasattr(model, "train"):
            model.train(True)


Convention = Literal["auto", "model", "logits"]


def detect_convention(fn: Any) -> str:
    """``logits`` when the function's first parameter is named ``logits``, else ``model``."""
    import inspect

    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return "model"
    return "logits" if params and params[0] == "logits" else "model"


def model_logits(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """The forward the gate runs for a logits-level function: eval mode, no grad, position ids
    ``cumsum(mask) - 1`` clamped at 0, logits as float32 ``(B, T, V)``."""
    import torch

    with torch.inference_mode():
        output = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids_from_mask(attention_mask),
        )
    return _logits_of(output).float()


def as_model_level(fn: Any, convention: str = "auto") -> Any:
    """A model-level view of a trainer log-prob function.

    ``model`` convention: ``fn(model, input_ids, attention_mask, *, temperature, top_k, top_p,
    mode)`` is returned unchanged. ``logits`` convention (TRL's ``selective_log_softmax`` and
    verl's ``logprobs_from_logits`` style): the gate runs :func:`model_logits` and calls
    ``fn(logits, input_ids, attention_mask, temperature)`` with ``temperature`` the sampling
    temperature in processed mode and ``1.0`` in raw mode; top-k/top-p are not passed.
    Either way the result must be ``(B, T - 1)`` with ``out[:, t]`` scoring token ``t + 1``.
    """
    kind = detect_convention(fn) if convention == "auto" else convention
    if kind == "model":
        return fn

    def call(
        model: nn.Module,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        *,
        temperature: float = 1.0,
        mode: Mode = "raw",
        **_: Any,
    ) -> Any:
        logits = model_logits(model, input_ids, attention_mask)
        t = float(temperature) if mode == "processed" else 1.0
        return fn(logits, input_ids, attention_mask, t)

    call.convention = "logits"  # type: ignore[attr-defined]
    call.wrapped = fn  # type: ignore[attr-defined]
    return call
