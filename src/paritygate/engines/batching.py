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

A policy artifact (ONNX with a dynamic batch axis, TorchScript, ``.pt2``) is batched by
:class:`ServingPath`: raw observation rows through the serving preprocessing and one artifact
call, each row alone and in the layouts of :func:`policy_layouts` (:func:`policy_sweep`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from paritygate.errors import NonFiniteOutput

if TYPE_CHECKING:
    import torch

    from paritygate.engines.openai_endpoint import EndpointEngine
    from paritygate.engines.vllm_engine import VLLMEngine

Batch = Mapping[str, "torch.Tensor | None"]
"""A collated batch: ``input_ids`` (B, T), ``attention_mask`` and ``position_ids`` (B, T) or
``None``."""

Collate = Callable[[list[list[int]], int, str], Batch]
"""``collate(rows, pad_token_id, padding_side) -> {"input_ids", "attention_mask",
"position_ids"}`` (torch tensors; the mask and position ids may be ``None``)."""


def collate_padded(rows: list[list[int]], pad_token_id: int, padding_side: str
                   ) -> dict[str, torch.Tensor]:
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


def layout(rows: list[list[int]], batch: Batch) -> Layout:
    """Locate each row in ``batch`` (matched by its tokens) and say how it was laid out."""
    ids = batch["input_ids"]
    if ids is None:
        raise ValueError("the collated batch has no input_ids")
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


class _Output(Protocol):
    """What a causal-LM forward returns (an HF ``ModelOutput``): logits and the cache."""

    @property
    def logits(self) -> torch.Tensor: ...


class BatchRunner(Protocol):
    """One engine's batched scoring and greedy decoding (one call = one batch)."""

    def score(self, prompts: list[list[int]], completions: list[list[int]]
              ) -> list[np.ndarray]:
        """Raw log-probs (float64 arrays) of each completion's tokens after its prompt."""
        ...

    def greedy(
        self, prompts: list[list[int]], max_new_tokens: int, eos: set[int]
    ) -> list[tuple[list[int], list[float]]]:
        """Greedy tokens of each prompt (through the first EOS) and each step's top-2 margin."""
        ...


class HFBatchRunner:
    """The real HF model, each batch laid out by ``collate``."""

    def __init__(self, model: torch.nn.Module, collate: Collate, pad_token_id: int,
                 padding_side: str) -> None:
        self.model = model.eval()
        self.collate = collate
        self.pad_token_id = pad_token_id
        self.padding_side = padding_side
        params = inspect.signature(model.forward).parameters
        self._cache_key = "cache" if "cache" in params else "past_key_values"

    def batch(self, rows: list[list[int]]) -> tuple[Batch, Layout]:
        batch = self.collate([list(r) for r in rows], self.pad_token_id, self.padding_side)
        return batch, layout(rows, batch)

    def _forward(self, batch: Batch, **extra: object) -> _Output:
        import torch

        with torch.inference_mode():
            return self.model(
                input_ids=batch["input_ids"],
                attention_mask=batch.get("attention_mask"),
                position_ids=batch.get("position_ids"),
                **extra,
            )

    @staticmethod
    def _finite(logits: torch.Tensor, during: str) -> None:
        import torch

        if not bool(torch.isfinite(logits).all()):
            raise NonFiniteOutput(
                f"non-finite logits from the served model during {during}: NaN/Inf weights? "
                "(see weights_load)"
            )

    def score(self, prompts: list[list[int]], completions: list[list[int]]
              ) -> list[np.ndarray]:
        import torch

        rows = [p + c for p, c in zip(prompts, completions, strict=True)]
        batch, where = self.batch(rows)
        logits = self._forward(batch, use_cache=False).logits  # (B, T, V)
        out: list[np.ndarray] = []
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
            step: dict[str, torch.Tensor | None] = {"input_ids": nxt.unsqueeze(-1)}  # (B, 1)
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


# --- policy artifacts ------------------------------------------------------------------------

Feeds = dict[str, np.ndarray]


def policy_layouts(count: int) -> dict[str, list[list[int]]]:
    """Batches of probe indices per layout (the alone run is each index by itself)."""
    every = list(range(count))
    order = np.random.default_rng(0).permutation(count).tolist()
    return {
        "batched": [every],
        "pairs": [every[i : i + 2] for i in range(0, count, 2)],
        "reversed": [every[::-1]],
        "shuffled": [order],
    }


@dataclass(frozen=True)
class Gap:
    """The largest difference of any row from its alone run, and where."""

    value: float
    layout: str = ""
    row: int = -1


@dataclass(frozen=True)
class PolicySweep:
    """Every probe alone and in each layout, compared row by row."""

    outputs: Gap
    """Served outputs (every output of the artifact)."""
    inputs: Gap
    """Model inputs serving computed (0 without serving preprocessing)."""
    per_layout: dict[str, float]
    nonfinite: list[str]
    """``layout[row]`` of rows whose batched output holds NaN/Inf where the alone one does not."""
    batched_runs: int


class RowEngine(Protocol):
    """A policy artifact's engine: one call on the feeds as given, whatever their batch."""

    def run_batch(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...


class ServingPath:
    """Raw policy observations (rows of ``raw``, per input) through the serving preprocessing
    and one artifact call; ``state`` holds the other feeds' rows (a recurrent policy's state)."""

    def __init__(self, engine: RowEngine, serving: Mapping[str, Callable[[np.ndarray], object]],
                 raw: Feeds, state: Feeds) -> None:
        self.engine = engine
        self.raw, self.state = raw, state
        self.serving = dict(serving)

    def inputs(self, rows: list[int]) -> Feeds:
        out: Feeds = {}
        for name, values in self.raw.items():
            fn = self.serving.get(name)
            x = values[rows]
            out[name] = x if fn is None else np.asarray(fn(x.copy()), np.float32)
        return out

    def run(self, rows: list[int]) -> tuple[Feeds, Feeds]:
        """The model inputs serving computed for ``rows`` and the artifact's outputs."""
        inputs = self.inputs(rows)
        feeds = {**inputs, **{name: v[rows] for name, v in self.state.items()}}
        outs = self.engine.run_batch(feeds)
        return inputs, {name: np.asarray(v, np.float64) for name, v in outs.items()}


def _row_gap(batched: Mapping[str, np.ndarray], alone: Mapping[str, np.ndarray], j: int) -> float:
    gaps = [float(np.max(np.abs(batched[n][j] - alone[n][0]), initial=0.0)) for n in alone]
    gap = max(gaps, default=0.0)
    return gap if np.isfinite(gap) else float("inf")


def policy_sweep(path: ServingPath, count: int) -> PolicySweep:
    """Run each row alone, then in every :func:`policy_layouts` layout, and compare."""
    alone = [path.run([i]) for i in range(count)]
    out_gap, in_gap = Gap(0.0), Gap(0.0)
    per_layout: dict[str, float] = {}
    nonfinite: list[str] = []
    runs = 0
    for name, batches in policy_layouts(count).items():
        worst = 0.0
        for batch in batches:
            inputs, outs = path.run(batch)
            runs += 1
            for j, i in enumerate(batch):
                a_in, a_out = alone[i]
                gap = _row_gap(outs, a_out, j)
                if gap == float("inf") and all(np.isfinite(v).all() for v in a_out.values()):
                    nonfinite.append(f"{name}[{i}]")
                if gap > out_gap.value:
                    out_gap = Gap(gap, name, i)
                pre = _row_gap({n: v.astype(np.float64) for n, v in inputs.items()},
                               {n: v.astype(np.float64) for n, v in a_in.items()}, j)
                if pre > in_gap.value:
                    in_gap = Gap(pre, name, i)
                worst = max(worst, gap)
        per_layout[name] = worst
    return PolicySweep(out_gap, in_gap, per_layout, nonfinite, runs)


class VLLMBatchRunner:
    """vLLM's offline ``LLM``: each batch is one ``generate`` call over its prompts."""

    def __init__(self, engine: VLLMEngine) -> None:
        self.engine = engine

    def score(self, prompts: list[list[int]], completions: list[list[int]]
              ) -> list[np.ndarray]:
        from paritygate.engines.vllm_engine import _import_vllm

        vllm = _import_vllm()
        rows = [p + c for p, c in zip(prompts, completions, strict=True)]
        params = vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        outputs = self.engine.llm.generate(
            [{"prompt_token_ids": r} for r in rows], params, use_tqdm=False
        )
        scored: list[np.ndarray] = []
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


class EndpointBatchRunner:
    """An OpenAI-compatible server: each batch is its requests sent concurrently, so the
    server's scheduler batches them with each other as it batches its clients'."""

    def __init__(self, engine: EndpointEngine) -> None:
        self.engine = engine

    @property
    def max_model_len(self) -> int | None:
        """The server's context length (``GET /models``), when it says."""
        return self.engine.info().max_model_len

    def score(self, prompts: list[list[int]], completions: list[list[int]]
              ) -> list[np.ndarray]:
        return [np.asarray(row, dtype=np.float64)
                for row in self.engine.score(prompts, completions)]

    def greedy(
        self, prompts: list[list[int]], max_new_tokens: int, eos: set[int]
    ) -> list[tuple[list[int], list[float]]]:
        from paritygate.engines.generation import SamplingSpec
        from paritygate.engines.openai_endpoint import parse_choice

        sampling = SamplingSpec(max_new_tokens=max_new_tokens, do_sample=False,
                                eos_token_ids=sorted(eos))
        bodies = [self.engine.body(p, sampling, logprobs=2, greedy=True) for p in prompts]
        url = self.engine.url("completions")

        result: list[tuple[list[int], list[float]]] = []
        for choices in self.engine.complete(bodies):
            done = parse_choice(choices[0], url, want_logprobs=True)
            margins = []
            for step in done.top_logprobs:
                top = sorted(step.values(), reverse=True)
                margins.append(float(top[0] - top[1]) if len(top) > 1 else float("inf"))
            result.append((done.token_ids, margins))
        return result
