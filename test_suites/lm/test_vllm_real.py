"""The vLLM engine against a real vLLM (its CPU build here, CUDA on a GPU runner).

Runs wherever vLLM can serve the demo LM and is skipped with vLLM's reason elsewhere (the
README's "vLLM" section says how to install it), except in CI (``CI=true``), where a skip
fails: .ci/run installs vLLM's CPU build and runs these tests. The gates' configs ask for vLLM
(``engines: [hf, vllm]``, the ``vllm_variants`` fixture). On the demo LM: a clean served copy passes
``vllm_delta`` at the fp32/fp32 tier; each served fault of ``lm_zoo.VLLM_FAULTS`` fails
``vllm_delta`` with the causes ``logprob_delta`` names on the HF engine; ``generation_parity``
with ``engines: [vllm]`` agrees on the clean copy and names a length drift; a vLLM rollout
dump written by ``paritygate dump --engine vllm`` is audited clean with ``engines: [dump]``.
That a vLLM gate run in its own process ends with its verdict and no traceback text (vLLM's
shutdown inside the run, not in exit-time finalizers) is checked by .ci/vllm on every vLLM gate
it runs.

One vLLM engine serves every variant of one model directory (started once: the start
dominates on CPU). ``PARITYGATE_VLLM_FIGURES=FILE`` writes the measured deltas of both
engines per variant to FILE (JSON).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from lm_zoo import VLLM_FAULTS, clean_config, variant_config

from paritygate.engines.vllm_engine import vllm_unavailable_reason

_REASON = vllm_unavailable_reason()
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(_REASON is not None, reason=f"vLLM unavailable: {_REASON}"),
]
FIGURES: dict[str, Any] = {}


@pytest.fixture(scope="module", autouse=True)
def shared_engine(demo_lm: Path):
    """Each gate builds its own VLLMEngine; here they share one ``vllm.LLM`` per model (the
    newest is kept, an earlier one is shut down), and the demo's figures are written."""
    from paritygate.engines import vllm_engine

    reason = vllm_unavailable_reason(demo_lm)
    if reason is not None:
        pytest.skip(f"vLLM cannot serve the demo LM: {reason}")
    live: dict[str, Any] = {}
    build = vllm_engine.VLLMEngine.llm.fget
    shut_down = vllm_engine.VLLMEngine.close

    def shared(self: Any) -> Any:
        if self._llm is None:
            kwargs = self.llm_kwargs()
            key = repr(sorted((k, v) for k, v in kwargs.items() if k != "max_model_len"))
            if live.get("key") != key or live["len"] < (self.max_model_len or 0):
                if "engine" in live:
                    shut_down(live.pop("engine"))
                engine = vllm_engine.VLLMEngine(self.model_dir)
                engine.__dict__.update({k: v for k, v in self.__dict__.items() if k != "_llm"})
                build(engine)
                live.update(key=key, len=self.max_model_len or 0, engine=engine)
            self._llm = live["engine"]._llm
        return self._llm

    def close(self: Any) -> None:
        self._llm = None  # the shared engine outlives each gate

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(vllm_engine.VLLMEngine, "llm", property(shared))
        mp.setattr(vllm_engine.VLLMEngine, "close", close)
        yield
        if "engine" in live:
            shut_down(live.pop("engine"))
    if os.environ.get("PARITYGATE_VLLM_FIGURES"):
        Path(os.environ["PARITYGATE_VLLM_FIGURES"]).write_text(json.dumps(FIGURES, indent=1))


def _kinds(result: Any) -> set[str]:
    """The named causes of a result without their numbers: a finding's kind, or the name of
    the metric a verdict rule is about (a metric beyond its threshold)."""
    return {
        (r.finding if r.kind == "finding" else r.metric) or r.kind for r in result.reasons
    }


def _record(name: str, check: str, result: Any) -> None:
    keys = ("delta_max_abs", "delta_mean_abs", "delta_p99_abs", "k3_kl", "ratio_outside_frac",
            "n_tokens", "unexcused_divergences", "token_agreement")
    FIGURES.setdefault(name, {})[check] = {
        "status": result.status,
        "kinds": sorted(_kinds(result)),
        **{k: result.metrics[k] for k in keys if k in result.metrics},
    }


def _gate(demo_lm: Path, root: Path, name: str, fault: Any = None, **lm: Any) -> Any:
    from paritygate.config import config_from_dict
    from paritygate.gate import Gate

    out = root / name
    out.mkdir(parents=True, exist_ok=True)
    data = variant_config(demo_lm, out, fault)
    data["causal_lm"].update(lm)
    data["name"] = f"vllm-{name}".replace("_", "-")
    return Gate(config_from_dict(data, out / "gate.yaml"))


def test_clean_served_copy_passes(vllm_variants) -> None:
    for check in ("vllm_delta", "logprob_delta"):
        result = vllm_variants.evaluate("clean", check)
        _record("clean", check, result)
        assert result.status == "pass", result.message
    assert FIGURES["clean"]["vllm_delta"]["n_tokens"] > 0


def test_generation_parity_with_vllm(demo_lm: Path, tmp_path: Path, vllm_variants) -> None:
    from lm_zoo import FAULTS

    clean = _gate(demo_lm, tmp_path, "clean", engines=["vllm"]).evaluate(
        "generation_parity", golden=False
    )
    _record("clean", "generation_parity[vllm]", clean)
    assert clean.status == "pass", clean.message
    fault = next(f for f in FAULTS if f.name == "max_new_tokens_differs")
    vllm = _gate(demo_lm, tmp_path, fault.name, fault, engines=["vllm"]).evaluate(
        "generation_parity", golden=False
    )
    hf = vllm_variants.evaluate(fault.name, "generation_parity")
    _record(fault.name, "generation_parity[vllm]", vllm)
    _record(fault.name, "generation_parity[hf]", hf)
    assert vllm.status == hf.status == "fail", vllm.message
    assert "length drift" in vllm.message
    assert _kinds(vllm) == _kinds(hf)


def test_vllm_dump_is_audited(demo_lm: Path, tmp_path: Path) -> None:
    from paritygate.config import config_from_dict
    from paritygate.engines.rollout_dump import read_dump
    from paritygate.families.causal_lm.dump import dump_rollouts
    from paritygate.gate import Gate

    data = clean_config(demo_lm)
    data["name"] = "vllm-dump"
    path = dump_rollouts(
        config_from_dict(data, tmp_path / "gate.yaml"), tmp_path / "vllm.jsonl", engine="vllm"
    )
    records = read_dump(path)
    assert {r.get("engine") for r in records} == {"vllm"}
    assert any(r["sampling"].do_sample for r in records)
    assert any(not r["sampling"].do_sample for r in records)
    data["causal_lm"]["engines"] = ["dump"]
    data["causal_lm"]["engine"]["dump"] = str(path)
    gate = Gate(config_from_dict(data, tmp_path / "audit.yaml"))
    for check in ("logprob_delta", "generation_parity"):
        result = gate.evaluate(check, golden=False)
        _record("dump", check, result)
        assert result.status == "pass", result.message


@pytest.mark.parametrize("name", VLLM_FAULTS)
def test_served_fault_named_like_hf(vllm_variants, name: str) -> None:
    hf = vllm_variants.evaluate(name, "logprob_delta")
    vllm = vllm_variants.evaluate(name, "vllm_delta")
    _record(name, "logprob_delta", hf)
    _record(name, "vllm_delta", vllm)
    assert hf.status == "fail", hf.message
    assert vllm.status == "fail", vllm.message
    assert _kinds(vllm) == _kinds(hf), (vllm.reasons, hf.reasons)


def test_vllm_lora_serving_of_the_training_adapter(vllm_variants) -> None:
    """Base + adapter on both sides, vLLM serving the adapter as a LoRA (enable_lora,
    LoRARequest): vllm_delta passes with the training adapter and fails with its lora_alpha
    doubled, which weights_load names adapter_scale_differs (c = 2)."""
    clean = vllm_variants.evaluate("adapter_served_lora", "vllm_delta")
    _record("adapter_served_lora", "vllm_delta", clean)
    assert clean.status == "pass", clean.message
    doubled = vllm_variants.evaluate("adapter_served_alpha_doubled", "vllm_delta")
    _record("adapter_served_alpha_doubled", "vllm_delta", doubled)
    assert doubled.status == "fail", doubled.message
    weights = vllm_variants.evaluate("adapter_served_alpha_doubled", "weights_load")
    assert weights.finding_kinds() == ["adapter_scale_differs"]
