"""The training side's recompute of an engine's generations.

The engine samples continuations of the probe prompts and reports each token's
log-prob; the trainer's log-prob function (the one named in the config)
recomputes them with one teacher-forced forward over ``prompt + output``
(left-padded batches, eval mode). ``logprob_delta`` and ``vllm_delta`` compare the two.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from paritygate.engines.generation import Generation, SamplingSpec, left_pad

if TYPE_CHECKING:
    from torch import nn

def teacher_forced_rows(
    model: nn.Module, generation: Generation, pad_id: int, *, batch_size: int = 8
) -> list[np.ndarray]:
    """The training model's next-token logits over each generated row, from one batched
    teacher-forced forward without a cache (the trainer's view): prompt + output left-padded,
    position ids ``cumsum(mask) - 1``. Row ``i`` is ``(len(output_i) + 1, V)`` float32: the
    logits at the last prompt position, at each generated token, and after the last one."""
    import torch

    from paritygate.families.causal_lm.logprobs import position_ids_from_mask

    n = len(generation.output_ids)
    rows: list[np.ndarray] = []
    for start in range(0, n, batch_size):
        idx = range(start, min(n, start + batch_size))
        seqs = [generation.prompt_ids[i] + generation.output_ids[i] for i in idx]
        ids, mask = left_pad(seqs, pad_id)  # (B, T)
        with torch.inference_mode():
            logits = model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=position_ids_from_mask(mask),
                use_cache=False,
            ).logits  # (B, T, V)
        width = ids.shape[1]
        for b, i in enumerate(idx):
            k = len(generation.output_ids[i])
            rows.append(logits[b, width - k - 1 :].float().cpu().numpy().copy())  # (k + 1, V)
    return rows


def processing_args(sampling: SamplingSpec) -> dict[str, float | int | None]:
    """The sampling knobs a processed log-prob depends on, in compute_logprobs' terms."""
    return {
        "temperature": sampling.temperature if sampling.temperature > 0 else 1.0,
        "top_k": sampling.top_k or None,
        "top_p": sampling.top_p if sampling.top_p < 1.0 else None,
    }


def recompute(
    model: nn.Module, logprob_fn: Callable[..., object], generation: Generation, *,
    sampling: SamplingSpec, mode: str, pad_id: int | None, batch_size: int = 8,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Trainer log-probs of every generated token: ``(logp_train, logp_infer, mask)``, (B, L).

    ``model`` is the training-side model, ``logprob_fn`` the trainer's model-level
    log-prob function, ``sampling`` the reference sampling config (greedy: raw log-probs)."""
    if not sampling.do_sample:
        mode = "raw"
    pad = 0 if pad_id is None else pad_id
    n = len(generation.output_ids)
    width = max((len(o) for o in generation.output_ids), default=0)
    logp_train = np.zeros((n, max(width, 1)), dtype=np.float64)
    logp_infer = np.zeros_like(logp_train)
    mask = np.zeros(logp_train.shape, dtype=bool)
    for start in range(0, n, batch_size):
        rows = range(start, min(n, start + batch_size))
        seqs = [generation.prompt_ids[i] + generation.output_ids[i] for i in rows]
        ids, attn = left_pad(seqs, pad)  # (B, T)
        out = _as_numpy(logprob_fn(model, ids, attn, mode=mode, **processing_args(sampling)))
        total = ids.shape[1]
        for b, i in enumerate(rows):
            k = len(generation.output_ids[i])
            if k == 0:
                continue
            # Generated token j sits at column total-k+j; its log-prob at column total-k+j-1.
            logp_train[i, :k] = out[b, total - k - 1 : total - 1]
            logp_infer[i, :k] = generation.logprobs[i]
            mask[i, :k] = True
    return logp_train, logp_infer, mask


def _as_numpy(out: object) -> np.ndarray:
    """A log-prob tensor ``(B, T-1)`` as float numpy."""
    import torch

    assert isinstance(out, torch.Tensor), type(out)
    return out.detach().float().cpu().numpy()
