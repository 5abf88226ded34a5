"""The probes' continuations and the trainer's forwards over them, computed once per run.

Greedy and sampled continuations come from a serving engine under the serving side's
sampling config; the training side's model teacher-forces them (its logits over each row)
and recomputes the trainer's log-probs of the sampled tokens. ``logits_agreement``,
``generation_parity``, ``logprob_delta``, ``reward_parity`` and ``routing_agreement`` share
one generation of each kind per engine and one forward per generation (memoised by identity).
A dump (``engines: [dump]``) is read in bounded batches instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from paritygate.engines.generation import Generation, SamplingSpec

if TYPE_CHECKING:
    import numpy as np

    from paritygate.engines.dump_audit import DumpSummary
    from paritygate.families.causal_lm.engines import Engines
    from paritygate.families.causal_lm.logprobs import TrainerLogprobs
    from paritygate.families.causal_lm.sides import LMSide


@dataclass(frozen=True, eq=False)
class Generations:
    """Each engine's greedy and sampled generations and the training model's forwards over
    them, built on first use and shared by the checks."""

    training: LMSide
    serving: LMSide
    engines: Engines
    """The serving side's engines by name (``hf``, ``vllm``, ``endpoint``), each built once."""
    seed: int
    """The gate's seed: a sampling config without one samples with it."""
    samples: int
    """``causal_lm.generation_samples``: sampled continuations per probe."""
    logprobs: TrainerLogprobs
    """The trainer's log-prob function (``causal_lm.training.logprob_fn``) and its mode."""
    read_dump: Callable[[], DumpSummary]
    """Validates and counts ``engine.dump`` (called once, when a check first asks)."""

    @cached_property
    def _samples(self) -> dict[str, tuple[Generation, SamplingSpec]]:
        return {}

    @cached_property
    def _greedies(self) -> dict[str, Generation]:
        return {}

    @cached_property
    def _teacher_forced(self) -> list[tuple[Generation, list[np.ndarray]]]:
        """``(generation, rows)`` of every generation teacher-forced so far (by identity)."""
        return []

    def sampled(self, engine: str = "hf") -> tuple[Generation, SamplingSpec]:
        """Sampled continuations (``samples`` per probe) under the serving config (a dump's
        records stream instead: :meth:`dump_batches`)."""
        if engine not in self._samples:
            sampling = self.engines.applied(engine).spec()
            if sampling.seed is None:
                sampling = SamplingSpec(**{**sampling.as_dict(), "seed": self.seed})
            prompts = [p for p in self.serving.prompts for _ in range(self.samples)]
            # an unknown engine: Engines says so
            self._samples[engine] = self.engines[engine].generate(prompts, sampling), sampling
        return self._samples[engine]

    def greedy(self, engine: str = "hf") -> Generation:
        """Greedy continuations of every probe under the serving config's length and stops
        (a dump's records stream instead: :meth:`dump_batches`)."""
        if engine not in self._greedies:
            sampling = self.engines.applied(engine).spec().greedy()
            extra = {"keep_logits": True} if engine == "hf" else {}  # logits_agreement's
            self._greedies[engine] = self.engines[engine].generate(
                self.serving.prompts, sampling, **extra)
        return self._greedies[engine]

    def teacher_forced(self, generation: Generation) -> list[np.ndarray]:
        """The training model's logits over each row of ``generation`` (one batched forward,
        no cache, computed once per generation): row ``i`` is ``(len(output_i) + 1, V)``,
        the next-token logits at the last prompt position, each generated token and after the
        last one."""
        for seen, rows in self._teacher_forced:
            if seen is generation:
                return rows
        rows = self.teacher_forced_once(generation)
        self._teacher_forced.append((generation, rows))
        return rows

    def teacher_forced_once(self, generation: Generation) -> list[np.ndarray]:
        """:meth:`teacher_forced` without keeping the rows: a dump's audit forces one bounded
        batch at a time and drops it."""
        from paritygate.families.causal_lm.recompute import teacher_forced_rows

        return teacher_forced_rows(self.training.model(), generation, self.training.pad_id)

    def recompute(self, generation: Generation) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The trainer's log-probs of every generated token: ``(logp_train, logp_infer, mask)``."""
        from paritygate.families.causal_lm.recompute import recompute

        return recompute(self.training.model(), self.logprobs.fn, generation,
                         sampling=self.training.sampling.spec(), mode=self.logprobs.mode,
                         pad_id=self.training.tokenizer.pad_token_id)

    def vllm_served_rows(self) -> tuple[np.ndarray, np.ndarray, list[str]] | str:
        """vLLM's prompt log-probs in the trainer's gauge, or why not (:mod:`.served_logprobs`)."""
        from paritygate.families.causal_lm.served_logprobs import vllm_rows

        return vllm_rows(self.greedy("vllm"), self.teacher_forced, self.engines["vllm"],
                         [p.id for p in self.serving.probes])

    # -- a dump's records ----------------------------------------------------------
    @cached_property
    def dump_summary(self) -> DumpSummary:
        """The validated dump of ``engine.dump`` (``engines: [dump]``): its parts' counts."""
        return self.read_dump()

    def dump_batches(self, greedy: bool) -> Iterator[Generation]:
        """The dump's greedy (or sampled) records as generations of a bounded batch, in file
        order: a dump's audit holds one batch at a time, whatever the dump's size."""
        from paritygate.engines.dump_audit import dump_batches

        return dump_batches(self.dump_summary, greedy=greedy)
