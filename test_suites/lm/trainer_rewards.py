"""Reward functions written the way GRPO trainers take them: ``fn(prompts, completions, **kw)``
returning one float per completion.

- ``ends_with_period``: a rule-based format reward (1.0 when the completion ends a sentence).
- ``last_token_rm``: the reward model at ``MODEL_DIR`` read at the last real token, as
  transformers' sequence classifier reads it (a correct reward).
- ``token_mean_rm``: the same reward model's head averaged over the completion's positions.
- ``token_sum_rm``: the head summed over the completion's positions: a reward that grows with
  length (on the zoo's reward model the mean-pooled head's slope is below the last-token
  one's, so the length fault is the summed head).
- ``scaled_rm``: ``last_token_rm`` rescaled, ``2 x score + 0.5`` (rankings kept).
- ``raises``: a scorer that fails on its input.
- ``batch_dependent``: a reward normalised over the batch (each reward minus the batch mean).
- ``two_args``: the wrong signature (one text argument).
"""

from __future__ import annotations

from typing import Any

MODEL_DIR: str | None = None
"""Set by the test that gates these functions (the zoo's TRL-trained reward model)."""
_CACHE: dict[str, Any] = {}


def ends_with_period(prompts: list[str], completions: list[str], **kw: Any) -> list[float]:
    return [1.0 if c.rstrip().endswith(".") else 0.0 for c in completions]


def _per_position(prompt: str, completion: str) -> tuple[Any, int]:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    if MODEL_DIR not in _CACHE:
        _CACHE[MODEL_DIR] = (AutoModelForSequenceClassification.from_pretrained(MODEL_DIR).eval(),
                             AutoTokenizer.from_pretrained(MODEL_DIR))
    model, tok = _CACHE[MODEL_DIR]
    n_prompt = len(tok(prompt)["input_ids"])
    ids = torch.tensor([tok(prompt + completion + tok.eos_token)["input_ids"]])
    with torch.inference_mode():
        hidden = model.model(input_ids=ids).last_hidden_state  # (1, T, H)
        per_position = model.score(hidden)[0, :, 0]  # (T,)
    return per_position, n_prompt


def last_token_rm(prompts: list[str], completions: list[str], **kw: Any) -> list[float]:
    return [float(_per_position(p, c)[0][-1]) for p, c in zip(prompts, completions, strict=True)]


def scaled_rm(prompts: list[str], completions: list[str], **kw: Any) -> list[float]:
    return [2.0 * r + 0.5 for r in last_token_rm(prompts, completions)]


def raises(prompts: list[str], completions: list[str], **kw: Any) -> list[float]:
    raise KeyError("reward_model_path")


def token_mean_rm(prompts: list[str], completions: list[str], **kw: Any) -> list[float]:
    out = []
    for p, c in zip(prompts, completions, strict=True):
        per_position, n_prompt = _per_position(p, c)
        out.append(float(per_position[n_prompt:].mean()))
    return out


def token_sum_rm(prompts: list[str], completions: list[str], **kw: Any) -> list[float]:
    out = []
    for p, c in zip(prompts, completions, strict=True):
        per_position, n_prompt = _per_position(p, c)
        out.append(float(per_position[n_prompt:].sum()))
    return out


def batch_dependent(prompts: list[str], completions: list[str], **kw: Any) -> list[float]:
    raw = [float(len(c.split())) for c in completions]
    mean = sum(raw) / len(raw)
    return [r - mean for r in raw]


def two_args(text: str) -> list[float]:
    return [0.0]
