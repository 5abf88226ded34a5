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
    from paritygate.gate import Gate
    from paritygate.load import config_from_dict

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
    from paritygate.engines.rollout_dump import read_dump
    from paritygate.families.causal_lm.dump import dump_rollouts
    from paritygate.gate import Gate
    from paritygate.load import config_from_dict

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


def test_penalty_clean_twin_passes(vllm_variants) -> None:
    """Both sides at repetition_penalty 1.3 with a trainer function that applies it and
    declares it (causal_lm.training.logprob_applies): no penalty is found and both engines
    pass at the fp32/fp32 tier (vLLM multiplies by 1/penalty where the function divides: on
    the demo that arithmetic differs by a mean of -8e-9 nats, max 9.5e-7)."""
    for check in ("logprob_delta", "sampling_config", "vllm_delta"):
        result = vllm_variants.evaluate("repetition_penalty_declared", check)
        _record("repetition_penalty_declared", check, result)
        assert result.status == "pass", result.message
        assert "penalty_applied" not in result.finding_kinds(), result.message


def test_presence_penalty_named_on_vllm_refused_on_hf(demo_lm: Path, tmp_path: Path) -> None:
    """presence_penalty 1.5 on both sides: vLLM applies it, so sampling_config names it
    off-policy and vllm_delta names the penalty: a presence penalty of 1.5 on the tokens
    already in the completion, applied to the trainer's logits, predicts vLLM's log-probs
    (the residual collapses). HF generate has no presence penalty, so sampling with it there
    is refused naming the field and the engine."""
    from lm_zoo import presence_penalty_both

    from paritygate.errors import InputError

    gate = _gate(demo_lm, tmp_path, "presence_vllm", _patched(presence_penalty_both),
                 engines=["vllm"])
    config = gate.evaluate("sampling_config", golden=False)
    assert "off_policy_transform" in config.finding_kinds(), config.message
    delta = gate.evaluate("vllm_delta", golden=False)
    _record("presence_penalty_both", "vllm_delta", delta)
    assert "penalty_applied" in delta.finding_kinds(), delta.message
    fit = delta.details["penalty_fit"]
    assert fit["kind"] == "presence_penalty" and fit["strength"] == pytest.approx(1.5, rel=0.02)
    assert fit["explained"] > 0.95, fit
    hf = _gate(demo_lm, tmp_path, "presence_hf", _patched(presence_penalty_both),
               engines=["hf"])
    with pytest.raises(InputError) as err:
        hf.evaluate("logprob_delta", golden=False)
    assert err.value.key == "sampling presence_penalty" and "engine hf" in err.value.cause


def test_vllm_samples_reproduce_from_the_seed(demo_lm: Path, tmp_path: Path) -> None:
    """behaviour_parity's vLLM draw: the same seed gives the same samples (each sample its own
    seeded request), another seed other samples."""
    from paritygate.engines.generation import SamplingSpec
    from paritygate.engines.vllm_sampling import sample_n

    ctx = _gate(demo_lm, tmp_path, "seeds", engines=["vllm"]).context
    engine = ctx.engines["vllm"]  # the gates' engine (shared by the fixture)
    prompts = [p for p in ctx.serving.prompts if p][:2]
    draws = [sample_n(engine, prompts, SamplingSpec(seed=seed, max_new_tokens=12), 6)[0]
             for seed in (11, 11, 12)]
    assert draws[0].output_ids == draws[1].output_ids
    assert draws[0].output_ids != draws[2].output_ids
    assert len({tuple(o) for o in draws[0].output_ids[:6]}) > 1  # samples of one prompt differ


@pytest.mark.parametrize("name", ["clean", "bf16_serving_copy", "bf16_declared"])
def test_logits_agreement_one_verdict(demo_lm: Path, tmp_path: Path, vllm_variants,
                                      name: str) -> None:
    """One served copy, one verdict: logits_agreement on vLLM alone (prompt log-probs over the
    whole vocabulary) gives the HF engine's status and causes."""
    from lm_zoo import CLEAN_VARIANTS, FAULTS

    fault = next((f for f in (*FAULTS, *CLEAN_VARIANTS) if f.name == name), None)
    hf = vllm_variants.evaluate(name, "logits_agreement")
    vllm = _gate(demo_lm, tmp_path, name, fault, engines=["vllm"]).evaluate(
        "logits_agreement", golden=False)
    _record(name, "logits_agreement[hf]", hf)
    _record(name, "logits_agreement[vllm]", vllm)
    assert "vLLM prompt log-probs" in vllm.details["candidate"]
    assert vllm.status == hf.status, (vllm.message, hf.message)
    assert _kinds(vllm) == _kinds(hf), (vllm.reasons, hf.reasons)


def _patched(patch: Any) -> Any:
    """A zoo patch as the ``fault`` ``variant_config`` applies."""
    from lm_zoo import Fault

    return Fault("patched", patch, {})


def test_vllm_reads_a_served_generation_config_as_the_gate_does(demo_lm: Path,
                                                                 tmp_path: Path) -> None:
    """vLLM's own reading of the zoo's served generation_config.json files (its
    ``ModelConfig.get_diff_sampling_param``; no engine started) is the gate's
    (``engine_sampling.vllm_applies``): the fault's temperature 0.7 taken; the twin's top_k and
    do_sample left out, so vLLM's defaults (no top-k, sampling)."""
    from lm_zoo import clean_config, served_hf_defaults_vllm, served_temperature_vllm
    from vllm.config import ModelConfig

    from paritygate.families.causal_lm.engine_sampling import VLLM_TAKES, vllm_applies
    from paritygate.families.causal_lm.sampling import VLLM_DEFAULTS, load_sampling_file

    for name, patch in (("fault", served_temperature_vllm), ("twin", served_hf_defaults_vllm)):
        (tmp_path / name).mkdir()
        cfg = clean_config(demo_lm)
        patch(cfg, demo_lm, tmp_path / name)
        served = Path(cfg["causal_lm"]["serving"]["model_dir"])
        side = load_sampling_file(served / "generation_config.json", trainer=False,
                                  side_defaults={})
        gate = vllm_applies(side).values
        taken = ModelConfig(model=str(served), dtype="float32").get_diff_sampling_param()
        for field in VLLM_TAKES:
            value = taken.get("max_tokens" if field == "max_new_tokens" else field,
                              VLLM_DEFAULTS[field])
            value = 0 if field == "top_k" and value in (-1, None) else value
            assert gate[field] == value, (name, field, gate[field], taken)
    assert "top_k" not in taken and "temperature" in taken
