"""paritygate: a release gate proving an RL policy's inference path matches its training path.

``import paritygate`` stays light (no torch, onnxruntime, transformers or vllm);
the heavy pieces load when a gate actually runs. The Python API::

    from pathlib import Path
    from paritygate import Gate, write_reports

    gate = Gate.from_path("demo/configs/demo-policy.yaml")
    results = gate.run()                      # one CheckResult per check, judged with golden
    written = write_reports(gate, results, Path("reports/demo-policy"))
    print(written.status)                     # "pass" or "fail"

In a training loop, ``paritygate.mismatch(logp_train, logp_infer, mask)`` measures the
trainer/engine log-prob mismatch of a batch (see :mod:`paritygate.metrics.mismatch`), and
``paritygate.routing_mismatch(train_experts, infer_experts, mask)`` how often a mixture-of-experts
engine routed a token to other experts than the trainer (see :mod:`paritygate.metrics.routing`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from paritygate.startup import IMPORTED_AT as IMPORTED_AT

__version__ = "0.1.0"
__all__ = [
    "CHECK_IDS",
    "CheckResult",
    "Gate",
    "GateConfig",
    "InputError",
    "Measurement",
    "Mismatch",
    "RoutingMismatch",
    "WrittenReport",
    "export",
    "load_config",
    "mismatch",
    "routing_mismatch",
    "summary_table",
    "write_config",
    "write_reports",
]

if TYPE_CHECKING:
    from paritygate.checks import CHECK_IDS
    from paritygate.config import GateConfig
    from paritygate.errors import InputError
    from paritygate.families import export
    from paritygate.gate import Gate
    from paritygate.init import write_config
    from paritygate.load import load_config
    from paritygate.metrics.mismatch import Mismatch, mismatch
    from paritygate.metrics.routing import RoutingMismatch, routing_mismatch
    from paritygate.report import WrittenReport, summary_table, write_reports
    from paritygate.result import CheckResult, Measurement

_LAZY = {
    "Gate": "paritygate.gate",
    "GateConfig": "paritygate.config",
    "load_config": "paritygate.load",
    "InputError": "paritygate.errors",
    "CheckResult": "paritygate.result",
    "Measurement": "paritygate.result",
    "CHECK_IDS": "paritygate.checks",
    "export": "paritygate.families",
    "write_config": "paritygate.init",
    "mismatch": "paritygate.metrics.mismatch",
    "Mismatch": "paritygate.metrics.mismatch",
    "routing_mismatch": "paritygate.metrics.routing",
    "RoutingMismatch": "paritygate.metrics.routing",
    "WrittenReport": "paritygate.report",
    "summary_table": "paritygate.report",
    "write_reports": "paritygate.report",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'paritygate' has no attribute {name!r}")
