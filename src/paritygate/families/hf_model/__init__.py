"""The hf_model family: any Hugging Face model directory, gated for precision and weights.

``config`` the ``hf_model:`` section · ``probes`` the inputs (text tokenized by the
directory's tokenizer, or an ``.npz`` of token ids) · ``context`` the model loaded once,
its checkpoint coverage (tensors left at random init, unused keys) and the precision
subject · ``export`` refuses: this family gates a model directory, it builds no artifact.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Collection

    from paritygate.config import GateConfig
    from paritygate.families.hf_model.context import HFModelContext


def build_context(config: GateConfig, *, needs: Collection[str] | None = None) -> HFModelContext:
    """Every input validated and composed, whatever ``needs`` (the family builds one context:
    none of its checks is config-only and it has no setups of its own)."""
    from paritygate.families.hf_model.context import build_hf_model_context

    return build_hf_model_context(config)


def export_artifact(config: GateConfig, out_dir: Path) -> Path:
    from paritygate.families.hf_model.export import export_unsupported

    return export_unsupported(config, out_dir)
