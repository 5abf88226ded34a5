"""``batch_invariance`` on a real vLLM (its CPU build, or CUDA on a GPU runner): each batch is
one ``LLM.generate`` call. Skipped with vLLM's reason where it cannot serve the demo LM."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from lm_zoo import variant_config

from paritygate.engines.vllm_engine import vllm_unavailable_reason

_REASON = vllm_unavailable_reason()
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(_REASON is not None, reason=f"vLLM unavailable: {_REASON}"),
]


def _evaluate(demo_lm: Path, out: Path, declared: bool) -> Any:
    from paritygate.gate import Gate
    from paritygate.load import config_from_dict

    reason = vllm_unavailable_reason(demo_lm)
    if reason is not None:
        pytest.skip(f"vLLM cannot serve the demo LM: {reason}")
    data = variant_config(demo_lm, out, None)
    data["name"] = "bi-vllm"
    data["causal_lm"]["engines"] = ["vllm"]
    if declared:
        data["causal_lm"].setdefault("serving", {})["batch_invariant"] = True
    return Gate(config_from_dict(data, out / "gate.yaml")).evaluate("batch_invariance",
                                                                     golden=False)


def test_vllm_batches_within_the_fp32_tier(demo_lm: Path, tmp_path: Path) -> None:
    result = _evaluate(demo_lm, tmp_path, declared=False)
    assert result.details["engine"] == "vllm"
    assert result.status == "pass", result.message


def test_vllm_declared_invariance_is_bitwise_or_named(demo_lm: Path, tmp_path: Path) -> None:
    result = _evaluate(demo_lm, tmp_path, declared=True)
    bitwise = result.metrics["bitwise_identical"]
    assert (result.status == "pass") == bitwise, result.message
    if not bitwise:
        assert result.finding_kinds() == ["not_bitwise"], result.message
