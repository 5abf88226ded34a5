"""The causal-LM family context: everything the LM checks share, loaded and validated once.

The context holds the two sides (:class:`.LMSide`), the setups built from them (the serving
engines, the shared generations, the weights, and each check's own: reward, KL reference,
behaviour) and the few facts every check shares (the config, the probes, the checkpoint's
digest). Building it (:mod:`.build`) reads the config's files and raises
:class:`~paritygate.errors.InputError` naming the file and key of the first bad input. Models,
engines and generations load lazily and are memoised in the sides and setups, so a gate that
runs one check pays only for that check.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from paritygate.families.causal_lm.probes import Probe
from paritygate.families.causal_lm.served_files import Contradiction
from paritygate.provenance import sha256_file

if TYPE_CHECKING:
    from collections.abc import Collection, Mapping

    from paritygate.config import GateConfig
    from paritygate.config.causal_lm import CausalLMSpec
    from paritygate.families.causal_lm.behaviour_sides import BehaviourSetup
    from paritygate.families.causal_lm.engines import Engines
    from paritygate.families.causal_lm.generations import Generations
    from paritygate.families.causal_lm.logprobs import TrainerLogprobs
    from paritygate.families.causal_lm.reference import ReferenceSetup
    from paritygate.families.causal_lm.reward import RewardSetup
    from paritygate.families.causal_lm.served_weights import WeightsSetup
    from paritygate.families.causal_lm.sides import LMSide
    from paritygate.metrics.tiers import Limits
    from paritygate.precision.subject import PrecisionSubject
    from paritygate.result import Measurement


@dataclass
class LMContext:
    """Loaded inputs of a causal-LM gate run (satisfies the family Context protocol)."""

    config: GateConfig
    spec: CausalLMSpec
    training: LMSide
    """What the trainer optimised: ``causal_lm.model_dir`` (and adapter), training tokenizer,
    sampling config and dtype."""
    serving: LMSide
    """What is served: the served directory (``causal_lm.serving.model_dir``, else the
    training directory), serving tokenizer, sampling config and dtype."""
    checkpoint_path: Path
    checkpoint_sha256: str
    probes: list[Probe]
    logprobs: TrainerLogprobs
    """The trainer's log-prob function and the reference helpers checks compare it with."""
    engines: Engines
    """The serving side's engines by name, each built on first use."""
    generations: Generations
    """The probes' greedy and sampled continuations (or a dump's records) and the training
    model's forwards over them, each computed once and shared by the checks."""
    weights: WeightsSetup
    """The training and served weights ``weights_load`` compares."""
    behaviour: BehaviourSetup | None
    """``behaviour_parity``'s setup (``None`` without a ``causal_lm.behaviour`` block)."""
    declared_dtype: tuple[str, str] | None = None
    """``(config key, dtype)`` when the config states the serving dtype: a deliberate
    precision change, judged by its precision tier rather than as a sampling difference."""
    family: str = "causal_lm"
    served_config_dtype: str | None = None
    """The dtype the served directory's ``config.json`` states (``None``: none)."""
    contradictions: list[Contradiction] = field(default_factory=list)
    """Declared serving files that differ from the served directory's own
    (:mod:`~paritygate.families.causal_lm.served_files`): ``sampling_config`` and
    ``tokenizer_parity`` record them."""
    cut_probes: list[str] = field(default_factory=list)
    """Ids of probes whose text was cut by characters before tokenizing (see
    :func:`~paritygate.families.causal_lm.tokenizer.cut_probe`)."""
    kl_reference: ReferenceSetup | None = None
    """The validated ``causal_lm.reference`` block (``reference_parity``), ``None`` when absent."""
    reward: RewardSetup | None = None
    """The validated ``causal_lm.reward`` block (``reward_parity``), ``None`` when absent."""

    def note_probes(self, m: Measurement) -> None:
        """Name the probes whose text was cut before tokenizing, in a check's measurement."""
        if self.cut_probes:
            from paritygate.families.causal_lm.tokenizer import MAX_CHARS_PER_TOKEN

            limit = self.spec.max_prompt_tokens * MAX_CHARS_PER_TOKEN
            m.note(f"probe text cut to {limit} characters before tokenizing "
                   f"(max_prompt_tokens x {MAX_CHARS_PER_TOKEN}): {', '.join(self.cut_probes)}")

    @property
    def numerics(self) -> dict[str, str]:
        """Settings that move the numbers by design, recorded with a blessed baseline: a
        regression against a baseline blessed under other settings says so."""
        return {"serving dtype": self.spec.engine.dtype, "training dtype": self.spec.training.dtype}

    def served_limits(
        self, defaults: Mapping[str, float | None], user_set: Collection[str],
        names: Collection[str] | None = None,
    ) -> Limits:
        """A check's limits for the served copy (see :func:`.limits.served_limits`)."""
        from paritygate.families.causal_lm.limits import served_limits

        return served_limits(self.spec, self.declared_dtype, defaults, user_set, names)

    @cached_property
    def probes_sha256(self) -> str:
        """Digest of the probe prompts file."""
        return sha256_file(self.spec.probes)

    def close(self) -> None:
        """Shut down the engines this run started that hold processes (:meth:`.Engines.close`),
        while the run's streams are open."""
        self.engines.close()

    def precision_subject(self) -> PrecisionSubject:
        """The training side's model in fp32 eval on the probe prompts (:mod:`.precision`)."""
        from paritygate.families.causal_lm.precision import precision_subject

        return precision_subject(self.spec, self.training, name=self.config.name,
                                 streaming=self.config.precision.streaming)
