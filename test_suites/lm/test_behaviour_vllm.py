"""behaviour_parity with vLLM serving (``engines: [hf, vllm]``): vLLM draws the serving side,
``n`` samples per prompt in one request each; the clean served copy passes and a serving
temperature of 0.8 fails ``logprob_differs``. Runs where vLLM serves the demo LM (its CPU
build in .ci/vllm); skipped with vLLM's reason elsewhere."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from lm_zoo import _sampling, variant_config

from paritygate.engines.vllm_engine import vllm_unavailable_reason

_REASON = vllm_unavailable_reason()
pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(_REASON is not None, reason=f"vLLM unavailable: {_REASON}")]


def _evaluate(demo_lm: Path, out: Path, **serving: Any) -> Any:
    from paritygate.gate import Gate
    from paritygate.load import config_from_dict

    data = variant_config(demo_lm, out, None)
    data["causal_lm"]["engines"] = ["hf", "vllm"]
    data["causal_lm"]["behaviour"] = {}
    if serving:
        _sampling(data, "serving", out, **serving)
    data["name"] = "bp"
    return Gate(config_from_dict(data, out / "gate.yaml")).evaluate("behaviour_parity",
                                                                    golden=False)


def test_behaviour_vllm_clean_passes(demo_lm: Path, tmp_path: Path) -> None:
    result = _evaluate(demo_lm, tmp_path)
    assert result.status == "pass", result.message
    assert result.details["sources"]["serving"] == "vllm generate"


def test_behaviour_vllm_hot_serving_fails(demo_lm: Path, tmp_path: Path) -> None:
    result = _evaluate(demo_lm, tmp_path, temperature=0.8)
    assert result.status == "fail" and "logprob_differs" in result.finding_kinds(), (
        result.message)
