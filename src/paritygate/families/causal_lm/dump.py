"""Write a serving engine's rollouts of the probe prompts as a rollout dump.

``paritygate dump CONFIG --out FILE`` (a GPU job with ``--engine vllm``) writes what
``engines: [dump]`` audits elsewhere (a CPU job): the sampled rollouts
(``generation_samples`` per probe, serving sampling config) and the greedy ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from paritygate.config import GateConfig


def dump_rollouts(config: GateConfig, out: Path, *, engine: str = "hf") -> Path:
    """Generate with ``engine`` and write the dump to ``out`` (JSONL, or Parquet by suffix)."""
    from paritygate.engines.rollout_dump import dump_records, write_dump
    from paritygate.errors import InputError
    from paritygate.families import build_context
    from paritygate.families.causal_lm.context import LMContext

    if config.family != "causal_lm":
        raise InputError(config.path, "family", "paritygate dump needs a causal_lm gate")
    ctx = build_context(config)
    assert isinstance(ctx, LMContext)  # family causal_lm builds an LMContext
    try:
        generation, sampling = ctx.generations.sampled(engine)
        greedy = ctx.generations.greedy(engine)
    finally:
        ctx.close()  # vLLM's engine processes end here, not in its exit-time finalizers
    records = dump_records(generation, sampling)
    if greedy is not None:
        records += dump_records(greedy, ctx.serving.sampling.spec().greedy())
    return write_dump(out, records)
