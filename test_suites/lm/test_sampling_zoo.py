"""One sampling model on the HF engine (demo LM): a penalty both sides agree on is still named
off-policy by ``sampling_config`` and found in the log-prob delta's shape by ``logprob_delta``
(``penalty_applied``), the root cause being ``off_policy_transform``; the clean twin (the
trainer's log-prob function applies the same penalty and the config declares it) passes; a
field HF ``generate`` cannot apply is refused naming it and the engine; ``behaviour_parity``'s
draw follows the gate's ``seed``. The vLLM side of each is in ``test_vllm_real.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from lm_zoo import SAMPLING_VARIANTS, Fault, _sampling, presence_penalty_both, variant_config


def _gate(demo_lm: Path, out: Path, patch: Any = None, **top: Any) -> Any:
    from paritygate.gate import Gate
    from paritygate.load import config_from_dict

    data = variant_config(demo_lm, out, Fault("patched", patch, {}) if patch else None)
    data.update(top)
    data["name"] = "sampling-zoo"
    return Gate(config_from_dict(data, out / "gate.yaml"))


def test_agreed_penalty_is_named_and_is_the_root(lm_variants) -> None:
    from paritygate.rootcause import explain

    fault = next(f for f in SAMPLING_VARIANTS if f.name == "repetition_penalty_both")
    config = lm_variants.evaluate(fault.name, "sampling_config")
    assert config.finding_kinds() == ["off_policy_transform"], config.message
    delta = lm_variants.evaluate(fault.name, "logprob_delta")
    assert "penalty_applied" in delta.finding_kinds(), delta.message
    for check_id, cause in fault.causes.items():
        assert cause in lm_variants.evaluate(fault.name, check_id).message
    assert "repetition_penalty 1.3" in delta.message
    fit = delta.details["penalty_fit"]  # the penalty predicts the engine's log-probs
    assert fit["kind"] == "repetition_penalty" and fit["strength"] == pytest.approx(1.3, rel=0.01)
    assert fit["explained"] > 0.99, fit
    explained, root = explain([config, delta])
    assert root is not None and (root.check, root.kind) == ("sampling_config",
                                                            "off_policy_transform")
    assert {r.id: r.consequence_of for r in explained}["logprob_delta"] == "sampling_config"


def test_declared_penalty_is_the_clean_twin(lm_variants) -> None:
    for check in ("sampling_config", "logprob_delta", "logprob_impl"):
        result = lm_variants.evaluate("repetition_penalty_declared", check)
        assert result.status == "pass", f"{check}: {result.message}"


@pytest.mark.parametrize("fault", ["stale_checkpoint", "min_p_one_side"])
def test_other_faults_are_not_a_penalty(lm_variants, fault: str) -> None:
    """Stale weights move the logits of every token; a min_p on the serving side alone
    raises every kept token: no penalty strength predicts either delta."""
    delta = lm_variants.evaluate(fault, "logprob_delta")
    assert delta.status == "fail" and "penalty_applied" not in delta.finding_kinds(), (
        delta.message)


def test_hf_refuses_presence_penalty(demo_lm: Path, tmp_path: Path) -> None:
    from paritygate.errors import InputError

    gate = _gate(demo_lm, tmp_path, presence_penalty_both)
    with pytest.raises(InputError) as err:
        gate.evaluate("logprob_delta", golden=False)
    assert err.value.key == "sampling presence_penalty" and "engine hf" in err.value.cause


def test_behaviour_draw_follows_the_seed(demo_lm: Path, tmp_path: Path) -> None:
    """The same gate seed draws the same samples, another seed others (the sampling file's
    own ``seed: 0`` no longer pins the draw): 8 samples per probe, lengths compared."""
    def lengths(seed: int, name: str) -> Any:
        out = tmp_path / name
        out.mkdir()
        return _behaviour(demo_lm, out, seed).details["length_histogram"]

    first = lengths(3, "a")
    assert first == lengths(3, "b")
    assert first != lengths(4, "c")


def _behaviour(demo_lm: Path, out: Path, seed: int) -> Any:
    from paritygate.gate import Gate
    from paritygate.load import config_from_dict

    data = variant_config(demo_lm, out, None)
    data["seed"] = seed
    data["causal_lm"]["behaviour"] = {"samples": 8}
    _sampling(data, "serving", out)
    data["name"] = "bp-seed"
    return Gate(config_from_dict(data, out / "gate.yaml")).evaluate("behaviour_parity",
                                                                    golden=False)


def test_served_generation_config_as_vllm_applies_it(demo_lm: Path, tmp_path: Path) -> None:
    """A served generation_config.json under vLLM: a temperature it states is vLLM's default
    (fault: field_differs), while top_k and do_sample it leaves out are not applied (clean
    twin: the trainer's top_k -1 agrees). HF reads the same twin file with its own defaults
    (top_k 50, greedy) and the gate says so under engine hf."""
    from lm_zoo import served_hf_defaults_vllm, served_temperature_vllm

    (tmp_path / "fault").mkdir()
    fault = _gate(demo_lm, tmp_path / "fault", served_temperature_vllm).evaluate(
        "sampling_config", golden=False)
    assert fault.finding_kinds() == ["field_differs"], fault.message
    assert "temperature differs: training 1.0 vs serving 0.7" in fault.message
    (tmp_path / "twin").mkdir()
    twin = _gate(demo_lm, tmp_path / "twin", served_hf_defaults_vllm).evaluate(
        "sampling_config", golden=False)
    assert twin.status == "pass", twin.message

    def both(cfg: Any, model: Path, out: Path) -> None:
        served_hf_defaults_vllm(cfg, model, out)
        cfg["causal_lm"]["engines"] = ["hf", "vllm"]

    (tmp_path / "hf").mkdir()
    hf = _gate(demo_lm, tmp_path / "hf", both).evaluate("sampling_config", golden=False)
    assert set(hf.finding_kinds()) == {"field_differs"}, hf.message
    assert "top_k differs: training 0 vs serving 50" in hf.message
    assert "under engine hf" in hf.message and "under engine vllm" not in hf.message


def test_served_generation_config_without_eos(demo_lm: Path, tmp_path: Path) -> None:
    """A served generation_config.json that states no eos_token_id: HF generate then stops on
    no EOS token (fault: field_differs eos_token_id under engine hf); vLLM stops on the
    tokenizer's EOS whatever the file says (clean twin: the same file under vLLM passes)."""
    from lm_zoo import served_no_eos_hf, served_no_eos_vllm

    (tmp_path / "fault").mkdir()
    fault = _gate(demo_lm, tmp_path / "fault", served_no_eos_hf).evaluate(
        "sampling_config", golden=False)
    assert fault.finding_kinds() == ["field_differs"], fault.message
    assert "eos_token_id differs" in fault.message and "under engine" not in fault.message
    assert "states no eos_token_id" in fault.message
    (tmp_path / "twin").mkdir()
    twin = _gate(demo_lm, tmp_path / "twin", served_no_eos_vllm).evaluate(
        "sampling_config", golden=False)
    assert twin.status == "pass", twin.message
