"""HF ``generate`` with a KV cache as a generation engine (CPU).

Prompts are batched with the serving tokenizer's padding side (left for a correct
setup) and decoded with ``use_cache=True``. Per-token log-probs come from the
scores ``generate`` returns: ``output_logits`` (raw model distribution) or
``output_scores`` (after temperature / top-k / top-p: the processed distribution).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from paritygate.engines.generation import (
    HF_APPLIES,
    Generation,
    LogprobsMode,
    SamplingSpec,
    refuse_unapplied,
)
from paritygate.engines.hf_loading import load_causal_lm, quiet_transformers
from paritygate.errors import InputError, NonFiniteOutput

if TYPE_CHECKING:
    import numpy as np
    import torch


def hf_transforms(sampling: SamplingSpec) -> dict[str, object]:
    """``GenerationConfig`` keywords for the distribution-moving fields HF applies besides the
    modelled ones (``no_repeat_ngram_size``, ``bad_words_ids``...; see ``HF_APPLIES``)."""
    return {k: v for k, v in sampling.transforms.items()
            if k in HF_APPLIES and k not in ("repetition_penalty", "min_new_tokens")}


def _repetition_penalty(penalty: float, mask: torch.Tensor) -> Any:
    """HF's repetition penalty over each row's own tokens: HF's processor also reads a
    left-padded row's pads and penalises the pad id (transformers 5.19: the declared-penalty
    twin's delta biased by -2.2e-6 nats, beyond the fp32/fp32 1e-6 mean bound)."""
    import torch
    from transformers import LogitsProcessor

    pads = (mask == 0).sum(-1)  # (B,) left pads per row

    class OwnTokensRepetitionPenalty(LogitsProcessor):  # type: ignore[misc]
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            vocab = scores.shape[-1]
            positions = torch.arange(input_ids.shape[1], device=input_ids.device)
            ids = input_ids.masked_fill(positions[None, :] < pads[:, None], vocab)  # (B, T)
            seen = torch.zeros((scores.shape[0], vocab + 1), dtype=torch.bool,
                               device=scores.device).scatter_(1, ids, True)[:, :vocab]
            penalised = torch.where(scores < 0, scores * penalty, scores / penalty)
            return torch.where(seen, penalised, scores)

    return OwnTokensRepetitionPenalty()


class HFGenerateEngine:
    """The serving path as HF ``generate`` with a KV cache."""

    name = "hf"

    def __init__(
        self,
        model: Any,
        *,
        pad_token_id: int,
        eos_token_id: int | None,
        padding_side: str = "left",
        logprobs_mode: LogprobsMode = "processed",
        top_logprobs: int = 5,
        batch_size: int = 8,
        tokenizer: Any = None,
    ) -> None:
        self.model = model.eval()
        self.pad_token_id = pad_token_id
        self.eos_token_id = eos_token_id
        self.padding_side = padding_side
        self.logprobs_mode = logprobs_mode
        self.top_logprobs = top_logprobs
        self.batch_size = batch_size
        self.tokenizer = tokenizer

    @classmethod
    def from_dir(
        cls,
        model_dir: Path,
        tokenizer: Any,
        *,
        dtype: str = "float32",
        trust_remote_code: bool = False,
        **kwargs: Any,
    ) -> HFGenerateEngine:
        """Load the serving model from ``model_dir``; pad/eos ids and padding side from
        the serving ``tokenizer``."""
        model, _ = load_causal_lm(model_dir, dtype, trust_remote_code=trust_remote_code)
        return cls.for_tokenizer(model, tokenizer, **kwargs)

    @classmethod
    def for_tokenizer(cls, model: Any, tokenizer: Any, **kwargs: Any) -> HFGenerateEngine:
        """Serve an already loaded ``model``; pad/eos ids and padding side from ``tokenizer``."""
        return cls(
            model,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            padding_side=tokenizer.padding_side,
            tokenizer=tokenizer,
            **kwargs,
        )

    def _pad(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            if self.padding_side == "left":
                ids[i, width - len(p) :] = torch.tensor(p)
                mask[i, width - len(p) :] = 1
            else:
                ids[i, : len(p)] = torch.tensor(p)
                mask[i, : len(p)] = 1
        return ids, mask  # (B, T), (B, T)

    def _nonfinite(self, during: str) -> str:
        return (
            f"non-finite logits from the served model (engine {self.name}) during {during}: "
            "NaN/Inf weights? (see weights_load)"
        )

    def _cut(self, tokens: list[int], stop: list[str], eos: set[int]) -> int:
        """Length of a generated row: through the first EOS or completed stop string."""
        for j, tok in enumerate(tokens):
            if tok in eos:
                return j + 1
            if stop and self.tokenizer is not None:
                text = self.tokenizer.decode(tokens[: j + 1])
                if any(s in text for s in stop):
                    return j + 1
        return len(tokens)

    def _check_stop_strings(self, stop: list[str]) -> None:
        """HF's stop-string matcher works on the tokenizer's pieces and cannot be built for
        some vocabularies (a word-level one lacks the pieces it probes): say so by the key,
        never as a traceback from the middle of generate."""
        from transformers.generation.stopping_criteria import StopStringCriteria

        try:
            StopStringCriteria(self.tokenizer, stop)
        except ValueError as exc:
            raise InputError(
                None, "sampling stop",
                f"HF generate cannot match the stop strings {stop} with this tokenizer "
                f"(transformers' stop-string matcher: {exc}); gate them with the vLLM engine "
                "or a rollout dump, or serve with a subword tokenizer",
            ) from None

    def generate(
        self, prompts: list[list[int]], sampling: SamplingSpec, *, keep_logits: bool = False
    ) -> Generation:
        """Generate for every prompt (batched), returning unpadded outputs and log-probs;
        ``keep_logits`` also keeps each row's raw logits at every generated token."""
        import torch
        from transformers import GenerationConfig

        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        warpers = (
            {"temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k}
            if sampling.do_sample
            else {}
        )
        if sampling.do_sample and sampling.min_p > 0.0:
            warpers["min_p"] = sampling.min_p
        refuse_unapplied(sampling, self.name, HF_APPLIES)
        # The served generation config's EOS ids end a response, else the tokenizer's; stop
        # token ids end it too.
        eos = list(sampling.eos_token_ids) or (
            [] if self.eos_token_id is None else [self.eos_token_id]
        )
        eos += [t for t in sampling.stop_token_ids if t not in eos]
        config = GenerationConfig(
            do_sample=sampling.do_sample,
            **warpers,
            **hf_transforms(sampling),
            repetition_penalty=1.0,  # applied below, the pads of a row left out
            max_new_tokens=sampling.max_new_tokens,
            min_new_tokens=sampling.min_new_tokens,
            stop_strings=list(sampling.stop) or None,
            eos_token_id=eos or None,
            pad_token_id=self.pad_token_id,
            use_cache=True,
            return_dict_in_generate=True,
            output_scores=True,
            output_logits=True,
        )
        if sampling.stop:
            self._check_stop_strings(list(sampling.stop))
        self.model.eval()
        out_ids: list[list[int]] = []
        out_lp: list[list[float]] = []
        out_top: list[list[dict[int, float]]] = []
        out_logits: list[np.ndarray] = []
        for start in range(0, len(prompts), self.batch_size):
            chunk = prompts[start : start + self.batch_size]
            ids, mask = self._pad(chunk)
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed + start)
            extra: dict[str, Any] = {"tokenizer": self.tokenizer} if sampling.stop else {}
            if sampling.repetition_penalty != 1.0:
                extra["logits_processor"] = [_repetition_penalty(sampling.repetition_penalty,
                                                                 mask)]
            with torch.inference_mode(), quiet_transformers():
                try:
                    res = self.model.generate(
                        input_ids=ids, attention_mask=mask, generation_config=config, **extra
                    )
                except RuntimeError as exc:  # torch.multinomial on NaN/Inf probabilities
                    if "probability tensor contains" not in str(exc):
                        raise
                    raise NonFiniteOutput(self._nonfinite("sampling")) from None
            if not all(bool(torch.isfinite(step).all()) for step in res.logits):
                raise NonFiniteOutput(self._nonfinite("greedy decoding"))
            steps = res.logits if self.logprobs_mode == "raw" else res.scores
            logp = torch.log_softmax(torch.stack(steps, dim=1).float(), dim=-1)  # (B, N, V)
            new = res.sequences[:, ids.shape[1] :]  # (B, N)
            chosen = logp.gather(-1, new.unsqueeze(-1)).squeeze(-1)  # (B, N)
            k = min(self.top_logprobs, logp.shape[-1])
            top_vals, top_idx = logp.topk(k, dim=-1) if k else (None, None)  # (B, N, k)
            raw = torch.stack(res.logits, dim=1).float() if keep_logits else None  # (B, N, V)
            for i in range(len(chunk)):
                row = new[i].tolist()
                n = self._cut(row, list(sampling.stop), set(eos))
                out_ids.append(row[:n])
                if raw is not None:
                    out_logits.append(raw[i, :n].cpu().numpy().copy())
                out_lp.append(chosen[i, :n].tolist())
                if top_idx is not None:
                    out_top.append(
                        [
                            dict(zip(top_idx[i, j].tolist(), top_vals[i, j].tolist(),  # type: ignore[index]
                                     strict=True))
                            for j in range(n)
                        ]
                    )
        return Generation(
            prompt_ids=[list(p) for p in prompts],
            output_ids=out_ids,
            logprobs=out_lp,
            top_logprobs=out_top if self.top_logprobs else None,
            logprobs_mode=self.logprobs_mode,
            engine=self.name,
            logits=out_logits if keep_logits else None,
        )

    def cached_logits(
        self, prompts: list[list[int]], outputs: list[list[int]]
    ) -> list[np.ndarray | None]:
        """Next-token logits at the last prompt position and each generated one, through the
        KV cache as serving computes them: one batched prefill of the left-padded prompts,
        then one token per row and step (position ids from the attention mask, so the
        amount of padding does not move them).

        Returns one ``(len(output_i), V)`` float32 array per row.
        """
        import inspect

        import torch

        model = self.model.eval()
        # transformers 5 names the cache ``cache``; 4.x ``past_key_values``.
        params = inspect.signature(model.forward).parameters
        key = "cache" if "cache" in params else "past_key_values"
        rows: list[np.ndarray | None] = []
        for start in range(0, len(prompts), self.batch_size):
            chunk = prompts[start : start + self.batch_size]
            outs = outputs[start : start + self.batch_size]
            steps = max((len(o) for o in outs), default=0)
            width = max(len(p) for p in chunk)
            ids = torch.full((len(chunk), width), self.pad_token_id, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for i, p in enumerate(chunk):
                ids[i, width - len(p) :] = torch.tensor(p)
                mask[i, width - len(p) :] = 1
            collected = []  # per step (B, V)
            with torch.inference_mode():
                out = model(
                    input_ids=ids,
                    attention_mask=mask,
                    position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                    use_cache=True,
                )
                collected.append(out.logits[:, -1].float())
                for j in range(steps - 1):
                    nxt = torch.tensor(
                        [[o[j] if j < len(o) else self.pad_token_id] for o in outs]
                    )  # (B, 1)
                    mask = torch.cat([mask, torch.ones((len(chunk), 1), dtype=torch.long)], 1)
                    out = model(
                        input_ids=nxt,
                        attention_mask=mask,
                        position_ids=mask.sum(-1, keepdim=True) - 1,
                        use_cache=True,
                        **{key: getattr(out, key)},
                    )
                    collected.append(out.logits[:, -1].float())
            stacked = torch.stack(collected, dim=1).cpu().numpy() if steps else None  # (B, S, V)
            for i, o in enumerate(outs):
                rows.append(stacked[i, : len(o)].copy() if stacked is not None else None)
        return rows
