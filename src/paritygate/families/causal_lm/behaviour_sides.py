"""``behaviour_parity``'s two sides: where the samples come from (HF ``generate``, vLLM with
``n`` samples per request, or rollout dumps read in streaming batches) and how one side's
samples are reduced, batch by batch, to the :class:`~paritygate.metrics.behaviour.SideSample`
the tests read. Only per-sample scalars are kept: memory is O(batch) in the records.

:class:`BehaviourSetup` is the check's setup: its block and one :class:`BehaviourSource` per
side (the side, its dump or its sampler), so the check treats both sides alike.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from paritygate.engines.dump_stream import Draw
from paritygate.errors import InputError
from paritygate.metrics.behaviour import SideSample, distinct_n, self_rouge_l

if TYPE_CHECKING:
    from paritygate.config.causal_lm import CausalLMSpec
    from paritygate.engines.base import GenerationEngine
    from paritygate.engines.generation import Generation, SamplingSpec
    from paritygate.families.causal_lm.engines import Engines
    from paritygate.families.causal_lm.sides import LMSide
    from paritygate.sections.behaviour_parity import BehaviourSpec

_SERVING_SEED_OFFSET = 1_000_003  # independent draws for the two sides
Reward = Callable[[str, str], float]
SCORE_BATCH = 32
"""Samples per teacher-forced forward: larger batches amortise the forward's overhead."""
LOGITS_BUDGET = 512 * 2**20
"""Bytes of float32 logits one forward's chunk may hold (fewer samples per forward for a
large vocabulary or long completions)."""


class Decoder(Protocol):
    """What the reducer needs of a tokenizer (structural: any HF tokenizer)."""

    eos_token_id: int | None

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str: ...


@dataclass
class SideReducer:
    """One side's samples reduced as they stream in: per sample its length, stop reason, format
    hit, reward and the trainer's scores; per prompt distinct-2 and self-ROUGE-L once the
    prompt has ``samples`` completions."""

    scorer: LMSide
    """The training side: its model scores every sample (the trainer's distribution)."""
    tokenizer: Decoder
    """The sampled side's tokenizer (decodes the samples for the format and the reward)."""
    config_path: Path
    samples: int
    pattern: re.Pattern[str] | None = None
    reward: Reward | None = None
    reward_key: str = "causal_lm.behaviour.reward_fn"
    lengths: list[int] = field(default_factory=list)
    finishes: list[str] = field(default_factory=list)
    """Each sample's finish reason (eos, stop, length, other), as engines report it."""
    means: list[float] = field(default_factory=list)
    hits: list[bool] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    diversity: list[float] = field(default_factory=list)
    rouge: list[float] = field(default_factory=list)
    score: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])
    """log-prob score sum and variance, repeat score sum and variance."""
    repeats: int = 0
    prompts: dict[tuple[int, ...], tuple[float, float, int]] = field(default_factory=dict)
    _open: dict[tuple[int, ...], list[list[int]]] = field(default_factory=dict)

    def add(self, draws: list[Draw]) -> None:
        """Reduce one batch: the trainer's logits in chunks small enough that a chunk's
        ``(tokens, vocab)`` rows stay within :data:`LOGITS_BUDGET` bytes, scored and dropped."""
        from paritygate.engines.generation import Generation
        from paritygate.families.causal_lm.recompute import teacher_forced_rows

        model = self.scorer.model()
        vocab = int(getattr(model.config, "vocab_size", 0) or 1)
        longest = 1 + max(len(d.completion_ids) for d in draws)
        step = max(1, min(SCORE_BATCH, LOGITS_BUDGET // (4 * vocab * longest)))
        for start in range(0, len(draws), step):
            chunk = draws[start : start + step]
            gen = Generation([list(d.scored_prompt or d.prompt_ids) for d in chunk],
                             [d.completion_ids for d in chunk], [[] for _ in chunk], None,
                             "raw", "behaviour")
            rows = teacher_forced_rows(model, gen, self.scorer.pad_id, batch_size=step)
            for draw, row in zip(chunk, rows, strict=True):
                self._score(draw, row)
            del rows
        for draw in draws:
            self.lengths.append(len(draw.completion_ids))
            self.finishes.append(draw.reason)
            text = self.tokenizer.decode(draw.completion_ids, skip_special_tokens=True)
            if self.pattern is not None:
                self.hits.append(bool(self.pattern.search(text)))
            if self.reward is not None:
                self._reward(draw, text)
            group = self._open.setdefault(draw.prompt_ids, [])
            group.append(draw.completion_ids)
            if len(group) >= self.samples:
                self._close(draw.prompt_ids)

    def _reward(self, draw: Draw, text: str) -> None:
        assert self.reward is not None
        prompt = self.tokenizer.decode(list(draw.prompt_ids), skip_special_tokens=True)
        try:
            value = float(self.reward(prompt, text))
        except Exception as exc:  # user code: bad input naming the key and the sample
            raise InputError(self.config_path, self.reward_key,
                             f"raised {type(exc).__name__}: {exc} on sample "
                             f"{len(self.lengths)} (completion {text[:60]!r})") from None
        if not np.isfinite(value):
            raise InputError(self.config_path, self.reward_key,
                             f"returned {value} on sample {len(self.lengths)}")
        self.rewards.append(value)

    def _score(self, draw: Draw, logits: np.ndarray) -> None:
        """Trainer log-prob and repeat scores of one sample: each exactly mean 0 with a known
        variance when the sample is drawn from the trainer's own distribution."""
        out = draw.completion_ids
        if not out:
            self.means.append(0.0)
            return
        z = np.asarray(logits[: len(out)], dtype=np.float64)  # (N, V)
        logp = z - z.max(-1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
        probs = np.exp(logp)
        chosen = logp[np.arange(len(out)), out]
        entropy = -(probs * logp).sum(-1)
        second = np.clip((probs * logp * logp).sum(-1) - entropy**2, 0, None)
        self.means.append(float(chosen.mean()))
        total, var = float((chosen + entropy).sum()), float(second.sum())
        self.score[0] += total
        self.score[1] += var
        key = draw.scored_prompt or draw.prompt_ids
        was = self.prompts.get(key, (0.0, 0.0, 0))
        self.prompts[key] = (was[0] + total, was[1] + var, was[2] + len(out))
        steps = np.arange(len(out))
        prompt = {t for t in (draw.scored_prompt or draw.prompt_ids) if t < z.shape[1]}
        first: dict[int, int] = {}
        for j, token in enumerate(out):
            first.setdefault(token, j)
        fresh = [t for t in first if t not in prompt]  # completion tokens not in the prompt
        born = np.array([first[t] for t in fresh], dtype=np.int64)
        later = born[None, :] < steps[:, None]  # (N, U): token t already sampled before step j
        q = probs[:, sorted(prompt)].sum(-1) + (probs[:, fresh] * later).sum(-1)
        hits = np.array([t in prompt or first[t] < j for j, t in enumerate(out)])
        self.repeats += int(hits.sum())
        self.score[2] += float((hits - q).sum())
        self.score[3] += float((q * (1 - q)).sum())

    def _close(self, prompt: tuple[int, ...]) -> None:
        group = self._open.pop(prompt)
        if len(group) >= 2:
            self.diversity.append(distinct_n(group))
            self.rouge.append(self_rouge_l(group))

    def finish(self) -> SideSample:
        """The side's reduced sample (prompts with fewer than ``samples`` draws included)."""
        for prompt in list(self._open):
            self._close(prompt)
        return SideSample(
            lengths=self.lengths, truncated=[r == "length" for r in self.finishes],
            diversity=self.diversity, logprob_means=self.means, score_sum=self.score[0],
            score_var=self.score[1], format_hits=self.hits if self.pattern else None,
            stop_reasons=self.finishes, rouge_l=self.rouge, repeats=self.repeats,
            repeat_sum=self.score[2], repeat_var=self.score[3], prompt_scores=self.prompts)


def side_sampling(side: LMSide, gate_seed: int, engine: str = "hf") -> SamplingSpec:
    """The side's sampling config as ``engine`` applies it (HF: the file as read) with a seed
    independent of the other side's, drawn from the gate's ``seed`` and the side's
    sampling-file ``seed``: a new gate seed is a fresh draw (re-check a suspected false alarm
    on other samples), the same seed the same draw."""
    import hashlib

    from paritygate.engines.generation import SamplingSpec
    from paritygate.families.causal_lm.engine_sampling import applied_by

    sampling = applied_by(engine, side.sampling).spec()
    key = f"{gate_seed}:{sampling.seed}:{side.name}".encode()
    seed = int.from_bytes(hashlib.sha256(key).digest()[:4], "big") % _SERVING_SEED_OFFSET
    return SamplingSpec(**{**sampling.as_dict(), "seed": seed})


def stop_reasons(gen: Generation, sampling: SamplingSpec, tok: Decoder) -> list[str]:
    """How each generated row ended: ``eos``, ``stop`` (a stop string), ``length``, ``other``."""
    eos = set(sampling.eos_token_ids) or ({tok.eos_token_id} if tok.eos_token_id is not None
                                          else set())
    reasons = []
    for out in gen.output_ids:
        if out and out[-1] in eos:
            reasons.append("eos")
        elif sampling.stop and any(s in tok.decode(out) for s in sampling.stop):
            reasons.append("stop")
        else:
            reasons.append("length" if len(out) >= sampling.max_new_tokens else "other")
    return reasons


def trainer_sampler(side: LMSide, batch_size: int) -> GenerationEngine:
    """HF ``generate`` on the side's own model, raw log-probs: the trainer's sampler."""
    from paritygate.engines.hf_generate import HFGenerateEngine

    return HFGenerateEngine.for_tokenizer(side.model(), side.tokenizer, logprobs_mode="raw",
                                          top_logprobs=0, batch_size=batch_size)


def generated(side: LMSide, engine: GenerationEngine, spec: BehaviourSpec, gate_seed: int,
              prompts: list[list[int]], scored: list[list[int]] | None = None,
              ) -> Iterator[list[Draw]]:
    """The side's samples from ``engine``: every prompt ``samples`` times in one batch (vLLM:
    one seeded request per sample); ``scored[i]`` is the prompt the trainer scores
    prompt ``i``'s samples after (the training side's rendering of the probe)."""
    from paritygate.engines.openai_endpoint import EndpointEngine
    from paritygate.engines.vllm_engine import VLLMEngine

    name = ("vllm" if isinstance(engine, VLLMEngine)
            else "endpoint" if isinstance(engine, EndpointEngine) else "hf")
    sampling = side_sampling(side, gate_seed, name)
    if isinstance(engine, VLLMEngine):
        from paritygate.engines.vllm_sampling import sample_n

        gen, reasons = sample_n(engine, prompts, sampling, spec.samples)
    elif isinstance(engine, EndpointEngine):
        gen, reasons = engine.sample_n(prompts, sampling, spec.samples)
    else:
        gen = engine.generate([p for p in prompts for _ in range(spec.samples)], sampling)
        reasons = stop_reasons(gen, sampling, side.tokenizer)
    after = {tuple(p): tuple(t) for p, t in zip(prompts, scored or prompts, strict=True)}
    draws = [Draw(tuple(p), list(o), r, after[tuple(p)] if after[tuple(p)] != tuple(p) else None)
             for p, o, r in zip(gen.prompt_ids, gen.output_ids, reasons, strict=True)]
    for start in range(0, len(draws), spec.batch_size):
        yield draws[start : start + spec.batch_size]


@dataclass(frozen=True, eq=False)
class BehaviourSource:
    """Where one side's samples come from: its dump, else its sampler."""

    side: LMSide
    dump: str | list[str] | None
    """``causal_lm.behaviour.<side>_dump``: the side's samples read from rollout dumps."""
    engine: str
    """The engine that samples the side (``hf``: HF ``generate``; the served engine)."""
    sampler: Callable[[], GenerationEngine]
    """Builds the side's sampler (called when the side is sampled)."""
    where: str
    """Where the sampled draws come from, as the report says it."""

    @property
    def key(self) -> str:
        """The config key of the side's dump (named when the dump is bad input)."""
        return f"causal_lm.behaviour.{self.side.name}_dump"


@dataclass(frozen=True, eq=False)
class BehaviourSetup:
    """What ``behaviour_parity`` needs: its block, a source per side (training first) and the
    training side, whose model scores every sample."""

    spec: BehaviourSpec
    sources: tuple[BehaviourSource, BehaviourSource]
    scorer: LMSide
    seed: int
    """The gate's seed: each side's draws and the reward's bootstrap derive from it."""
    config_path: Path
    can_sample: bool
    """An engine that samples is named (``hf``, ``vllm`` or ``endpoint``)."""

    def kept(self) -> set[int]:
        """Probes with tokens on both sides (an empty side is tokenizer_parity's finding)."""
        pairs = zip(*(source.side.prompts for source in self.sources), strict=True)
        return {i for i, prompts in enumerate(pairs) if all(prompts)}

    def reward(self) -> Reward | None:
        """``causal_lm.behaviour.reward_fn`` imported (``None`` when not set)."""
        if not self.spec.reward_fn:
            return None
        from paritygate.imports import import_callable

        fn: Reward = import_callable(self.spec.reward_fn, self.config_path,
                                     "causal_lm.behaviour.reward_fn")
        return fn

    def reducer(self, source: BehaviourSource, reward: Reward | None) -> SideReducer:
        """A side's streaming reduction of its samples, scored by the training side."""
        pattern = re.compile(self.spec.format_regex) if self.spec.format_regex else None
        return SideReducer(self.scorer, source.side.tokenizer, self.config_path,
                           self.spec.samples, pattern, reward)

    def draws(self, source: BehaviourSource, kept: set[int]) -> tuple[Iterator[list[Draw]], str]:
        """The side's batches of draws over the ``kept`` probes and where they come from."""
        from paritygate.engines.dump_stream import expand, stream_draws

        if source.dump is not None:
            from paritygate.engines.hf_loading import config_vocab_size

            paths = expand(source.dump, self.config_path.parent, source.key)
            vocab = config_vocab_size(self.scorer.model_dir)
            return (stream_draws(paths, batch=self.spec.batch_size, vocab_size=vocab),
                    f"{len(paths)} dump file(s) ({paths[0].name}...)")
        prompts = [p for i, p in enumerate(source.side.prompts) if i in kept]
        scored = [p for i, p in enumerate(self.scorer.prompts) if i in kept]
        return self.sampled(source, prompts, scored), source.where

    def sampled(self, source: BehaviourSource, prompts: list[list[int]],
                scored: list[list[int]] | None = None) -> Iterator[list[Draw]]:
        """The side's sampled completions of ``prompts`` in batches, from its sampler."""
        return generated(source.side, source.sampler(), self.spec, self.seed, prompts, scored)


def behaviour_setup(spec: CausalLMSpec, training: LMSide, serving: LMSide, engines: Engines,
                    seed: int, config_path: Path) -> BehaviourSetup | None:
    """The setup of ``causal_lm.behaviour`` (``None`` when absent): the trainer's side sampled
    by HF ``generate`` on its own model; the served side by an endpoint or vLLM where
    ``engines`` names one, else by the HF engine on the served model."""
    from paritygate.sections.behaviour_parity import BehaviourSpec

    block = BehaviourSpec.of(spec)
    if block is None:
        return None
    # A prompt's samples share one unpadded batch unless the config sets the batch size.
    batch = (spec.engine.batch_size if "batch_size" in spec.engine.model_fields_set
             else block.samples)
    served = next((e for e in ("endpoint", "vllm") if e in spec.engines), "hf")
    where = f"{served} generate"
    if served == "endpoint" and spec.endpoint is not None:
        ep = spec.endpoint
        where = (f"endpoint {ep.base_url}" + (" with its own sampling defaults, the serving "
                                              "config's being" if ep.sampling == "server"
                                              else ""))
    sources = (
        BehaviourSource(training, block.training_dump, "hf",
                        lambda: trainer_sampler(training, batch), "hf generate"),
        BehaviourSource(serving, block.serving_dump, served,
                        lambda: served_sampler(engines, served, batch), where),
    )
    return BehaviourSetup(block, sources, training, seed, config_path,
                          can_sample=bool({"hf", "vllm", "endpoint"} & set(spec.engines)))


def served_sampler(engines: Engines, name: str, batch_size: int) -> GenerationEngine:
    """The served engine ``name``; the HF engine as a copy with ``batch_size`` rows per call
    (the shared engine keeps its own batch size)."""
    import copy

    from paritygate.engines.hf_generate import HFGenerateEngine

    engine = engines[name]
    if isinstance(engine, HFGenerateEngine):
        engine = copy.copy(engine)
        engine.batch_size = batch_size
    return engine
