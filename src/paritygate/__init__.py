"""paritygate: a release gate proving an RL policy's inference path matches its training path.

``import paritygate`` stays light (no torch, onnxruntime, transformers or vllm);
the heavy pieces load when a gate actually runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["CheckResult", "Gate", "GateConfig", "InputError", "Measurement", "load_config"]

if TYPE_CHECKING:
    from paritygate.config import GateConfig, load_config
    from paritygate.errors import InputError
    from paritygate.gate import Gate
    from paritygate.result import CheckResult, Measurement

_LAZY = {
    "Gate": "paritygate.gate",
    "GateConfig": "paritygate.config",
    "load_config": "paritygate.config",
    "InputError": "paritygate.errors",
    "CheckResult": "paritygate.result",
    "Measurement": "paritygate.result",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'paritygate' has no attribute {name!r}")
