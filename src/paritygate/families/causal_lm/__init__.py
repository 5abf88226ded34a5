"""The causal-LM family: a Hugging Face training directory against the model that is served.

``config`` the ``causal_lm:`` section · ``serving`` the served model's keys folded in ·
``weights`` checkpoint tensors into the models · ``probes`` the prompt set · ``tokenizer``
and ``sampling`` the two sides' text and sampling protocols · ``logprobs`` the reference
per-token log-prob implementation · ``recompute`` the trainer's teacher-forced recompute ·
``context`` everything the checks share, loaded and validated once · ``export`` the serving
copy (training-only heads removed) and its manifest.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from paritygate.config import GateConfig
    from paritygate.engines.dump_stream import Draw
    from paritygate.families.causal_lm.behaviour_sides import Decoder, Reward, SideReducer
    from paritygate.families.causal_lm.context import LMContext
    from paritygate.families.causal_lm.sides import LMSide


def build_context(config: GateConfig, *, config_only: bool = False) -> LMContext:
    """Every input validated and composed; ``config_only``: only the sampling configs and
    ``config.json`` files (see :mod:`~paritygate.families.causal_lm.config_only`)."""
    if config_only:
        from paritygate.families.causal_lm.config_only import build_config_only_context

        return build_config_only_context(config)
    from paritygate.families.causal_lm.build import build_lm_context

    return build_lm_context(config)


def export_artifact(config: GateConfig, out_dir: Path) -> Path:
    from paritygate.families.causal_lm.export import export_serving_copy

    return export_serving_copy(config, out_dir)


def behaviour_samples(ctx: LMContext, side: LMSide, engine: str, prompts: list[list[int]],
                      scored: list[list[int]] | None = None) -> Iterator[list[Draw]]:
    """One side's sampled completions in batches (behaviour_parity's engine source): the
    trainer's side from HF ``generate`` on its own model, the served side from ``engine``."""
    import copy

    from paritygate.engines.hf_generate import HFGenerateEngine
    from paritygate.families.causal_lm.behaviour_sides import generated, trainer_sampler
    from paritygate.sections.behaviour_parity import BehaviourSpec

    spec = BehaviourSpec.of(ctx.spec)
    assert spec is not None
    # A prompt's samples share one unpadded batch unless the config sets the batch size.
    batch = (ctx.spec.engine.batch_size if "batch_size" in ctx.spec.engine.model_fields_set
             else spec.samples)
    sampler = trainer_sampler(side, batch) if side.trainer else ctx.engines[engine]
    if isinstance(sampler, HFGenerateEngine) and not side.trainer:
        sampler = copy.copy(sampler)  # the shared served engine keeps its own batch size
        sampler.batch_size = batch
    return generated(side, sampler, spec, ctx.config.seed, prompts, scored)


def behaviour_reducer(scorer: LMSide, tokenizer: Decoder, config_path: Path, samples: int,
                      pattern: re.Pattern[str] | None, reward: Reward | None) -> SideReducer:
    """A side's streaming reduction of its samples (lengths, finishes, scores, rewards),
    scored by the training side ``scorer``."""
    from paritygate.families.causal_lm.behaviour_sides import SideReducer

    return SideReducer(scorer, tokenizer, config_path, samples, pattern, reward)
