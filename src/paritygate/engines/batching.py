"""Run one batch of prompts through a serving engine the way it batches them.

``batch_invariance`` asks whether a probe's numbers depend on its batch. Each runner here takes
one batch (a list of token-id rows) and returns, per row, the engine's raw log-probs of fixed
completion tokens (teacher-forced, one batched forward) and its greedy tokens with their top-2
margins (one batched decode).

The HF runner batches through a *collate*: ``collate(rows, pad_token_id, padding_side)``
returns ``{"input_ids": (B, T), "attention_mask": (B, T) | None, "position_ids": (B, T) |
None}``, as a serving loop lays a batch out for the model. The default pads on the serving
tokenizer's side, passes the mask and derives position ids from it (what HF ``generate``
does); ``causal_lm.engine.collate`` names a serving stack's own. The vLLM runner submits the
batch as one ``LLM.generate`` call (vLLM lays batches out itself).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from paritygate.errors import NonFiniteOutput

Collate = Callable[[list[list[int]], int, str], Mapping[str, Any]]
"""``collate(rows, pad_token_id, padding_side) -> {"input_ids", "attention_mask",
"position_ids"}`` (torch tensors; the mask and position ids may be ``None``)."""


def collate_padded(rows: list[list[int]], pad_token_id: int, padding_side: str) -> dict[str, Any]:
    """Pad on ``padding_side``, pass the mask and position ids counted from it (pads at 0):
    every row sees the same positions and keys whatever its batch-mates."""
    import torch

    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        at = slice(width - len(row), width) if padding_side == "left" else slice(0, len(row))
        ids[i, at] = torch.tensor(row)
        mask[i, at] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": positions}


@dataclass(frozen=True)
class Layout:
    """Where a collated batch put each row, and what it passed to the model."""

    starts: list[int]
    """Column of each row's first token."""
    width: int
    right_padded: bool
    """A shorter row's pads follow its tokens: the model continues from a pad."""
    mask_passed: bool
    positions_from_mask: bool
    """Every row's real tokens sit at positions 0, 1, ... (counted from the mask)."""


def layout(rows: list[list[int]], batch: Mapping[str, Any]) -> Layout:
    """Locate each row in ``batch`` (matched by its tokens) and say how it was laid out."""
    ids = batch["input_ids"]
    width = int(ids.shape[1])
    starts: list[int] = []
    right = False
    for i, row in enumerate(rows):
        have = ids[i].tolist()
        if have[width - len(row):] == row:
            starts.append(width - len(row))
        elif have[: len(row)] == row:
            starts.append(0)
            right = right or len(row) < width
        else:
            raise ValueError(f"the collated batch does not hold row {i}'s tokens in order")
    pos = batch.get("position_ids")
    from_mask = pos is not None and all(
        pos[i, s : s + len(r)].tolist() == list(range(len(r)))
        for i, (s, r) in enumerate(zip(starts, rows, strict=True))
    )
    if pos is None:  # the model counts 0..T-1 over the padded row
        from_mask = all(s == 0 for s in starts)
    return Layout(starts, width, right, batch.get("attention_mask") is not None, from_mask)


class BatchRunner(Protocol):
    """One engine's batched scoring and greedy decoding (one call = one batch)."""

    def score(self, prompts: list[list[int]], completions: list[list[int]]) -> list[Any]:
        """Raw log-probs (float64 arrays) of each completion's tokens after its prompt."""
        ...

    def greedy(
        self, prompts: list[list[int]], max_new_tokens: int, eos: set[int]
    ) -> list[tuple[list[int], list[float]]]:
        """Greedy tokens of each prompt (through the first EOS) and each step's top-2 margin."""
        ...


class HFBatchRunner:
    """The real HF model, each batch laid out by ``collate``."""

    def __init__(self, model: Any, collate: Collate, pad_token_id: int, padding_side: str) -> None:
        self.model = model.eval()
        self.collate = collate
        self.pad_token_id = pad_token_id
        self.padding_side = padding_side
        params = inspect.signature(model.forward).parameters
        self._cache_key = "cache" if "cache" in params else "past_key_values"

    def batch(self, rows: list[list[int]]) -> tuple[Mapping[str, Any], Layout]:
        batch = self.collate([list(r) for r in rows], self.pad_token_id, self.padding_side)
        return batch, layout(rows, batch)

    def _forward(self, batch: Mapping[str, Any], **extra: Any) -> Any:
        import torch

        with torch.inference_mode():
            return self.model(
                input_ids=batch["input_ids"],
                attention_mask=batch.get("attention_mask"),
                position_ids=batch.get("position_ids"),
                **extra,
            )

    @staticmethod
    def _finite(logits: Any, during: str) -> None:
        import torch

        if not bool(torch.isfinite(logits).all()):
            raise NonFiniteOutput(
                f"non-finite logits from the served model during {during}: NaN/Inf weights? "
                "(see weights_load)"
            )

    def score(self, prompts: list[list[int]], completions: list[list[int]]) -> list[Any]:
        import torch

        rows = [p + c for p, c in zip(prompts, completions, strict=True)]
        batch, where = self.batch(rows)
        logits = self._forward(batch, use_cache=False).logits  # (B, T, V)
        out: list[Any] = []
        for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
            at = where.starts[i] + len(p) - 1
            step = logits[i, at : at + len(c)].float()  # (len(c), V)
            self._finite(step, "batched scoring")
            logp = torch.log_softmax(step, dim=-1)
            out.append(logp.gather(-1, torch.tensor(c).unsqueeze(-1)).squeeze(-1).double().numpy())
        return out

    def greedy(
        self, prompts: list[list[int]], max_new_tokens: int, eos: set[int]
    ) -> list[tuple[list[int], list[float]]]:
        import torch

        batch, where = self.batch(prompts)
        mask = batch.get("attention_mask")
        pos = batch.get("position_ids")
        tokens: list[list[int]] = [[] for _ in prompts]
        margins: list[list[float]] = [[] for _ in prompts]
        done = [False] * len(prompts)
        out = self._forward(batch, use_cache=True)
        for _ in range(max_new_tokens):
            last = out.logits[:, -1].float()  # (B, V): the last column, as generate reads it
            self._finite(last, "batched greedy decoding")
            top = last.topk(2, dim=-1)
            nxt = top.indices[:, 0]  # (B,)
            for i in range(len(prompts)):
                if not done[i]:
                    tokens[i].append(int(nxt[i]))
                    margins[i].append(float(top.values[i, 0] - top.values[i, 1]))
                    done[i] = int(nxt[i]) in eos or len(tokens[i]) >= max_new_tokens
            if all(done):
                break
            step: dict[str, Any] = {"input_ids": nxt.unsqueeze(-1)}  # (B, 1)
            if mask is not None:
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
                step["attention_mask"] = mask
            if pos is not None:
                pos = pos[:, -1:] + 1
                step["position_ids"] = pos
            out = self._forward(step, use_cache=True, **{self._cache_key: getattr(
                out, self._cache_key)})
        del where
        return list(zip(tokens, margins, strict=True))


class VLLMBatchRunner:
    """vLLM's offline ``LLM``: each batch is one ``generate`` call over its prompts."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def score(self, prompts: list[list[int]], completions: list[list[int]]) -> list[Any]:
        from paritygate.engines.vllm_engine import _import_vllm

        vllm = _import_vllm()
        rows = [p + c for p, c in zip(prompts, completions, strict=True)]
        params = vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        outputs = self.engine.llm.generate(
            [{"prompt_token_ids": r} for r in rows], params, use_tqdm=False
        )
        scored: list[Any] = []
        for out, p, c in zip(outputs, prompts, completions, strict=True):
            steps = out.prompt_logprobs  # one entry per prompt token (None for the first)
            values = [float(steps[len(p) + j][t].logprob) for j, t in enumerate(c)]
            scored.append(np.asarray(values, dtype=np.float64))
        return scored

    def greedy(
        self, prompts: list[list[int]], max_new_tokens: int, eos: set[int]
    ) -> list[tuple[list[int], list[float]]]:
        from paritygate.engines.vllm_engine import _import_vllm

        vllm = _import_vllm()
        params = vllm.SamplingParams(
            max_tokens=max_new_tokens, temperature=0.0, logprobs=2,
            stop_token_ids=sorted(eos) or None,
        )
        outputs = self.engine.llm.generate(
            [{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False
        )
        result: list[tuple[list[int], list[float]]] = []
        for out in outputs:
            done = out.outputs[0]
            ids = [int(t) for t in done.token_ids]
            margins = []
            for step in done.logprobs or []:
                top = sorted((lp.logprob for lp in step.values()), reverse=True)
                margins.append(float(top[0] - top[1]) if len(top) > 1 else float("inf"))
            result.append((ids, margins))
        return result
