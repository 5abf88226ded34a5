"""A mixture-of-experts checkpoint served by real vLLM: the tiny Qwen2-MoE of the routing zoo
(per-expert tensors in the file, fused experts in transformers >= 5) compared on vLLM as on
HF. The clean served copy passes ``vllm_delta``; a served copy with experts written in another
order (a converter's fault) fails ``vllm_delta`` with the causes ``logprob_delta`` names on
the HF engine: one verdict, whatever the engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from routing_zoo import VARIANTS, base_config

from paritygate.engines.vllm_engine import vllm_unavailable_reason
from paritygate.gate import Gate
from paritygate.load import config_from_dict

_REASON = vllm_unavailable_reason()
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(_REASON is not None, reason=f"vLLM unavailable: {_REASON}"),
]


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from moe_models import build_moe

    from paritygate.demo.causal_lm import CORPUS, _train_tokenizer

    root = tmp_path_factory.mktemp("moe_vllm")
    lines = [ln.strip() for ln in CORPUS.read_text(encoding="utf-8").splitlines() if ln.strip()]
    _train_tokenizer(lines).save_pretrained(root / "tokenizer")
    model = build_moe(root / "tokenizer", root / "model")
    reason = vllm_unavailable_reason(model)
    if reason is not None:
        pytest.skip(f"vLLM cannot serve the MoE: {reason}")
    return model


def _result(model: Path, out: Path, variant: str, engine: str, check: str) -> Any:
    cfg = base_config(model, engines=[engine])
    cfg["causal_lm"].pop("routing")
    next(v for v in VARIANTS if v.name == variant).build(cfg, model, out)
    return Gate(config_from_dict(cfg, out / "gate.yaml")).evaluate(check, golden=False)


def test_moe_on_vllm_one_verdict(moe_model: Path, tmp_path: Path) -> None:
    clean = _result(moe_model, tmp_path / "clean", "clean_copy", "vllm", "vllm_delta")
    assert clean.status == "pass", clean.message
    hf = _result(moe_model, tmp_path / "hf", "experts_permuted", "hf", "logprob_delta")
    vllm = _result(moe_model, tmp_path / "vllm", "experts_permuted", "vllm", "vllm_delta")
    assert hf.status == "fail", hf.message
    assert vllm.status == "fail", vllm.message
    assert vllm.finding_kinds() == hf.finding_kinds(), (vllm.reasons, hf.reasons)
