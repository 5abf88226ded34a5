"""What generation engines exchange: the sampling spec in, a :class:`Generation` out.

An engine (:class:`paritygate.engines.base.GenerationEngine`) turns prompt token ids
into generated token ids plus the log-prob it assigned to each generated token. The
training side then recomputes those log-probs with a teacher-forced forward;
:mod:`paritygate.checks.logprob_delta` compares the two.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

LogprobsMode = Literal["raw", "processed"]
"""``raw``: log-softmax of the model's logits; ``processed``: after temperature/top-k/top-p."""


@dataclass(frozen=True)
class SamplingSpec:
    """One sampling protocol, as the trainer's sampler or the serving engine uses it.

    Field names follow vLLM's ``SamplingParams`` where they exist (``max_tokens``
    is called ``max_new_tokens`` here, as in HF ``GenerationConfig``).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """0 (or -1 in vLLM files) means no top-k filtering."""
    repetition_penalty: float = 1.0
    max_new_tokens: int = 16
    min_new_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    seed: int | None = 0
    do_sample: bool = True
    min_p: float = 0.0
    """0 means no min-p filtering."""
    eos_token_ids: list[int] = field(default_factory=list)
    """Token ids that end a response (a generation config's ``eos_token_id``); empty: the
    serving tokenizer's EOS."""
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop_token_ids: list[int] = field(default_factory=list)
    """Token ids that end a response besides the EOS ids (vLLM ``stop_token_ids``)."""
    ignore_eos: bool = False
    transforms: dict[str, object] = field(default_factory=dict)
    """Other fields that move the sampled distribution, with their non-neutral values as
    written (``logit_bias``, ``bad_words_ids``, ``no_repeat_ngram_size``...): an engine
    applies those of its own API and refuses the rest by name
    (:func:`refuse_unapplied`)."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SamplingSpec:
        """Build from a mapping using either HF or vLLM field names.

        Accepts ``max_tokens``/``min_tokens`` (vLLM) for ``max_new_tokens``/
        ``min_new_tokens``, ``stop_strings`` (HF) for ``stop``, and ``top_k: -1``
        (vLLM) for no top-k. Unknown keys raise ``KeyError`` naming the key.
        """
        aliases = {
            "max_tokens": "max_new_tokens",
            "min_tokens": "min_new_tokens",
            "stop_strings": "stop",
        }
        known = {f.name for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        for raw_key, value in data.items():
            key = aliases.get(raw_key, raw_key)
            if key not in known:
                raise KeyError(raw_key)
            kwargs[key] = value
        if "stop" in kwargs:
            stop = kwargs["stop"]
            kwargs["stop"] = [stop] if isinstance(stop, str) else list(stop or [])
        if kwargs.get("top_k") is not None and int(kwargs["top_k"]) < 0:
            kwargs["top_k"] = 0
        for name in ("temperature", "top_p", "repetition_penalty", "min_p"):
            if name in kwargs and kwargs[name] is not None:
                kwargs[name] = float(kwargs[name])
        for name in ("top_k", "max_new_tokens", "min_new_tokens"):
            if name in kwargs and kwargs[name] is not None:
                kwargs[name] = int(kwargs[name])
        if "temperature" in kwargs and kwargs["temperature"] == 0.0 and "do_sample" not in data:
            kwargs["do_sample"] = False
        return cls(**kwargs)

    def greedy(self, max_new_tokens: int | None = None) -> SamplingSpec:
        """The same protocol with sampling switched off (argmax decoding)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(do_sample=False, temperature=1.0, top_p=1.0, top_k=0)
        if max_new_tokens is not None:
            values["max_new_tokens"] = max_new_tokens
        return SamplingSpec(**values)

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class Generation:
    """What an engine produced for a batch of prompts (no padding anywhere).

    ``logprobs[i][j]`` is the engine's log-prob of ``output_ids[i][j]``;
    ``top_logprobs[i][j]`` maps token id -> log-prob for the engine's top-k at
    that step, when the engine reports them. ``logprobs_mode`` says whether the
    log-probs are of the raw model distribution or the processed (temperature,
    top-k/top-p) one.
    """

    prompt_ids: list[list[int]]
    output_ids: list[list[int]]
    logprobs: list[list[float]]
    top_logprobs: list[list[dict[int, float]]] | None
    logprobs_mode: str
    engine: str
    logits: list[Any] | None = None
    """Per row, the raw next-token logits ``(len(output_ids[i]), V)`` the engine computed for
    each generated token, when it was asked to keep them (HF engine, ``keep_logits``)."""

    def rows(self, start: int, stop: int) -> Generation:
        """Rows ``start`` to ``stop`` (exclusive) as a generation of their own."""
        cut = slice(start, stop)
        return Generation(
            prompt_ids=self.prompt_ids[cut], output_ids=self.output_ids[cut],
            logprobs=self.logprobs[cut],
            top_logprobs=None if self.top_logprobs is None else self.top_logprobs[cut],
            logprobs_mode=self.logprobs_mode, engine=self.engine,
            logits=None if self.logits is None else self.logits[cut])

    def spans(self, tokens: int) -> list[tuple[int, int]]:
        """Consecutive row ranges whose ``len(output) + 1`` add up to at most ``tokens``
        each (a row longer than that alone): teacher-forced logits of one range fit a budget."""
        out: list[tuple[int, int]] = []
        start, total = 0, 0
        for i, output in enumerate(self.output_ids):
            size = len(output) + 1
            if i > start and total + size > tokens:
                out.append((start, i))
                start, total = i, 0
            total += size
        if start < len(self.output_ids):
            out.append((start, len(self.output_ids)))
        return out


HF_APPLIES: frozenset[str] = frozenset({
    "repetition_penalty", "min_new_tokens", "min_length", "bad_words_ids",
    "no_repeat_ngram_size", "sequence_bias", "suppress_tokens", "begin_suppress_tokens",
    "forced_bos_token_id", "forced_eos_token_id", "exponential_decay_length_penalty",
    "typical_p", "epsilon_cutoff", "eta_cutoff", "encoder_no_repeat_ngram_size",
    "encoder_repetition_penalty", "stop_token_ids",
})
"""Distribution-moving fields HF ``generate`` applies (``GenerationConfig`` fields); the
others (presence/frequency penalties, ``logit_bias``, ``allowed_token_ids``, ``ignore_eos``...)
are refused by name on the HF engine."""
VLLM_APPLIES: frozenset[str] = frozenset({
    "repetition_penalty", "presence_penalty", "frequency_penalty", "min_new_tokens",
    "logit_bias", "allowed_token_ids", "bad_words", "ignore_eos", "stop_token_ids",
})
"""Distribution-moving fields vLLM's ``SamplingParams`` applies; HF-only ones
(``no_repeat_ngram_size``, ``bad_words_ids``, ``typical_p``...) are refused by name."""


def refuse_unapplied(sampling: SamplingSpec, engine: str, applied: frozenset[str]) -> None:
    """Bad input naming the first field of ``sampling`` that moves the sampled distribution
    and that ``engine`` cannot apply (``applied``: the fields it implements): sampling
    without it would judge another distribution than the one the config states."""
    from paritygate.errors import InputError

    stated: dict[str, object] = dict(sampling.transforms)
    for name, neutral in (("presence_penalty", 0.0), ("frequency_penalty", 0.0),
                          ("ignore_eos", False), ("stop_token_ids", [])):
        if getattr(sampling, name) != neutral:
            stated[name] = getattr(sampling, name)
    for name, value in stated.items():
        if name not in applied:
            raise InputError(
                None, f"sampling {name}",
                f"engine {engine} does not apply {name} (value {value!r}); sampling without "
                f"it would judge another distribution than the config states: remove it, or "
                f"gate with an engine that applies it")


def is_processing_trivial(sampling: SamplingSpec) -> bool:
    """True when processed and raw log-probs coincide (T=1, no top-k/top-p)."""
    return sampling.temperature in (0.0, 1.0) and not sampling.top_k and sampling.top_p >= 1.0


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[Any, Any]:
    """``(B, T)`` input ids and attention mask, each row right-aligned."""
    import torch

    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s) :] = torch.tensor(s)
            mask[i, width - len(s) :] = 1
    return ids, mask
