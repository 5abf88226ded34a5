"""The torch-policy family: an ``nn.Module`` policy served through ONNX Runtime.

``config`` the ``policy:`` section · ``loading`` checkpoint tensors into the models ·
``probes`` probe observations and preprocessing · ``context`` everything the checks
share, loaded once, composing the helpers below · ``build`` loads and validates it ·
``export`` the ONNX artifact and its manifest.

Helpers take the spec, the engines and the feeds they use, never the context:
``sides`` the reference (training model) and heads-removed torch engines · ``artifact`` the
candidate engine over the artifact · ``validation`` bad input found up front ·
``recurrent`` state inputs · ``distribution`` a Gaussian policy's two sides ·
``rollout`` closed-loop episodes · ``initializers`` the artifact's weights against the
checkpoint · ``precision_subject`` the layer-by-layer precision subject.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Collection

    from paritygate.config import GateConfig
    from paritygate.families.policy.context import PolicyContext


def build_context(config: GateConfig, *, needs: Collection[str] | None = None) -> PolicyContext:
    """Every input validated and composed, whatever ``needs`` (the family builds one context:
    none of its checks is config-only and it has no setups of its own)."""
    from paritygate.families.policy.build import build_policy_context

    return build_policy_context(config)


def export_artifact(config: GateConfig, out_dir: Path) -> Path:
    """``paritygate export``: the inference model with the checkpoint, to ONNX + manifest."""
    from paritygate.families.policy.build import build_policy_context

    return build_policy_context(config, export_dir=out_dir, force_export=True).manifest_path
