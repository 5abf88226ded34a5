"""The causal-LM family: a Hugging Face training directory against the model that is served.

``config`` the ``causal_lm:`` section · ``serving`` the served model's keys folded in ·
``weights`` checkpoint tensors into the models · ``probes`` the prompt set · ``tokenizer``
and ``sampling`` the two sides' text and sampling protocols · ``logprobs`` the reference
per-token log-prob implementation · ``recompute`` the trainer's teacher-forced recompute ·
``context`` everything the checks share, loaded and validated once · ``export`` the serving
copy (training-only heads removed) and its manifest.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from paritygate.config import GateConfig
    from paritygate.families.causal_lm.context import LMContext


def build_context(config: GateConfig, *, needs: Collection[str] | None = None) -> LMContext:
    """The inputs ``needs`` names validated and composed (every one when ``None``); no need
    that loads: only the sampling configs and ``config.json`` files (see
    :mod:`~paritygate.families.causal_lm.config_only`)."""
    if needs is not None and not needs:
        from paritygate.families.causal_lm.config_only import build_config_only_context

        return build_config_only_context(config)
    from paritygate.families.causal_lm.build import build_lm_context

    return build_lm_context(config, needs=needs)


def export_artifact(config: GateConfig, out_dir: Path) -> Path:
    from paritygate.families.causal_lm.export import export_serving_copy

    return export_serving_copy(config, out_dir)
