"""Scoring sequences with an HF sequence classifier, recording where each score was read.

transformers' decoder classifiers compute the head at every position and keep the rightmost
token that is not ``config.pad_token_id`` (a batch needs a pad id). :func:`score` runs the
model's own forward (input ids and attention mask, as trainers call it) with a hook on the head
(``score``, or ``classifier``), so the caller can tell a score read at the last real token from
one read at a pad.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

from paritygate.errors import InputError, keyed


@dataclass
class Scores:
    """A batched scoring pass: the model's own scores and, per row, the position it read and
    the last real token (``-1`` where the head's per-position outputs were not observed)."""

    scores: list[float]
    read_at: list[int]
    last_real: list[int]
    read_pad: list[bool]
    error: str | None = None


@dataclass(eq=False)
class RewardModel:
    """One reward model the check scores with, loaded once on first use: the scoring copy
    (``causal_lm.reward.model_dir`` in its declared dtype) or the trained model (float32)."""

    directory: Path
    dtype: str
    key: str
    """The config key that named ``directory`` (named when it fails to load)."""
    trust_remote_code: bool = False
    _model: nn.Module | None = field(default=None, repr=False)

    def model(self) -> nn.Module:
        """The loaded classifier (eval mode)."""
        if self._model is None:
            with keyed(self.key):
                self._model = load_reward_model(self.directory, self.dtype,
                                                self.trust_remote_code)
        return self._model


def load_reward_model(directory: Path, dtype: str, trust_remote_code: bool) -> nn.Module:
    """An HF sequence-classification model in eval mode, from safetensors only."""
    from transformers import AutoModelForSequenceClassification

    from paritygate.engines.hf_loading import quiet_transformers, torch_dtype

    try:
        with quiet_transformers():
            model = AutoModelForSequenceClassification.from_pretrained(
                directory, dtype=torch_dtype(dtype), trust_remote_code=trust_remote_code,
                use_safetensors=True)
    except Exception as exc:
        raise InputError(directory, "model", f"cannot load reward model: {exc}") from None
    return model.eval()


def head_module(model: nn.Module) -> nn.Module | None:
    """The module that maps hidden states to the per-position score (``score`` in
    transformers' decoder classifiers, ``classifier`` in others); ``None`` when absent."""
    for name in ("score", "classifier"):
        module = getattr(model, name, None)
        if module is not None and hasattr(module, "register_forward_hook"):
            return module
    return None


def pad(
    seqs: list[list[int]], pad_id: int, side: str, extra: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, mask)`` ``(B, T)``, padded on ``side`` (``extra`` more pads on every row)."""
    import torch

    width = max(len(s) for s in seqs) + extra
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        lo = width - len(s) if side == "left" else 0
        ids[i, lo: lo + len(s)] = torch.tensor(s, dtype=torch.long)
        mask[i, lo: lo + len(s)] = 1
    return ids, mask


def score(model: nn.Module, seqs: list[list[int]], pad_id: int, side: str, batch_size: int,
          extra: int = 0) -> Scores:
    """Score ``seqs`` in batches padded on ``side`` through the model's own forward (input ids
    and attention mask, as trainers call it), recording where each score was read."""
    import torch

    head = head_module(model)
    out = Scores([], [], [], [])
    seen: dict[str, Any] = {}

    def keep(module: Any, args: Any, result: Any) -> None:
        seen["per_position"] = result  # (B, T, 1): the head at every position

    for lo in range(0, len(seqs), batch_size):
        chunk = seqs[lo: lo + batch_size]
        ids, mask = pad(chunk, pad_id, side, extra)
        seen.clear()
        handle = head.register_forward_hook(keep) if head is not None else None
        try:
            with torch.inference_mode():
                pooled = model(input_ids=ids, attention_mask=mask).logits  # (B, 1)
        except (ValueError, IndexError, RuntimeError) as exc:
            out.error = f"{type(exc).__name__}: {exc}"
            return out
        finally:
            if handle is not None:
                handle.remove()
        pooled = pooled.float()[:, 0]  # (B,)
        per_position: Any = seen.get("per_position")
        if not (hasattr(per_position, "dim") and per_position.dim() == 3
                and per_position.shape[1] == ids.shape[1]):
            per_position = None  # a pooled head (an encoder's classifier): no per-position view
        for row in range(len(chunk)):
            real = mask[row].nonzero().flatten()
            last = int(real[-1])
            out.scores.append(float(pooled[row]))
            out.last_real.append(last)
            if per_position is None:
                out.read_at.append(-1)
                out.read_pad.append(False)
                continue
            hits = (per_position[row, :, 0].float() == pooled[row]).nonzero().flatten()
            at = int(hits[-1]) if len(hits) else -1
            out.read_at.append(at)
            out.read_pad.append(at >= 0 and int(mask[row, at]) == 0)
    return out
