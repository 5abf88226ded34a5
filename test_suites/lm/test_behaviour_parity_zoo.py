"""Fault zoo of ``behaviour_parity`` on the demo LM at the default sample size (64 per prompt per
side): the clean twin (same sampling configs, independent seeds) passes; each serving sampling
fault fails with its named kind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from lm_zoo import _sampling, variant_config

BEHAVIOUR = {"format_regex": r"\.", "reward_fn": "lm_zoo_rewards:length_reward"}
FAULTS = {
    "temperature_0_8": ({"temperature": 0.8}, "logprob_differs"),
    "top_p_0_9": ({"top_p": 0.9}, "logprob_differs"),
    "max_new_tokens_halved": ({"max_tokens": 8}, "truncation_differs"),
    "stop_string_missing": ({"stop": []}, "stop_reason_differs"),
    "repetition_penalty_1_3": ({"repetition_penalty": 1.3}, "repetition_differs"),
}
TRAINING = {"stop": ["."]}
"""Both sides stop at a full stop: the serving side without it is the missing-stop fault."""


def _evaluate(demo_lm: Path, out: Path, serving: dict[str, Any] | None,
              behaviour: dict[str, Any] | None = None) -> Any:
    from paritygate.gate import Gate
    from paritygate.load import config_from_dict

    data = variant_config(demo_lm, out, None)
    data["causal_lm"]["behaviour"] = dict(BEHAVIOUR if behaviour is None else behaviour)
    _sampling(data, "training", out, **TRAINING)
    _sampling(data, "serving", out, **{**TRAINING, **(serving or {})})
    data["name"] = "bp"
    return Gate(config_from_dict(data, out / "gate.yaml")).evaluate("behaviour_parity",
                                                                    golden=False)


def test_clean_twin_passes(demo_lm: Path, tmp_path: Path) -> None:
    result = _evaluate(demo_lm, tmp_path, None)
    assert result.status == "pass", result.message
    stats = result.details["statistics"]
    assert set(stats) == {"length", "distinct_2", "self_rouge_l", "logprob_per_token",
                          "repeat_rate", "logprob_per_prompt", "truncation_rate", "eos_rate",
                          "stop_string_rate",
                          "format_hit_rate", "reward"}
    assert result.details["stop_reasons"]["serving"].get("stop", 0) > 0

    from paritygate.report import RENDERERS

    section = RENDERERS["behaviour_parity"](result, tmp_path)
    for name in stats:
        assert f"| {name} |" in section.markdown
    assert "samples per side to detect" in section.markdown
    assert (tmp_path / "behaviour.png").stat().st_size > 0 and "base64" in section.html
    assert stats["reward"]["low"] <= 0.05 and stats["reward"]["high"] >= -0.05


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_fault_named(demo_lm: Path, tmp_path: Path, name: str) -> None:
    serving, kind = FAULTS[name]
    result = _evaluate(demo_lm, tmp_path, serving)
    assert result.status == "fail", result.message
    assert kind in result.finding_kinds(), result.message


def test_halved_length_moves_the_reward_beyond_tolerance(demo_lm: Path, tmp_path: Path) -> None:
    result = _evaluate(demo_lm, tmp_path, {"max_tokens": 4})
    assert "reward_differs" in result.finding_kinds(), result.message
    assert "0.05" in result.message


def test_skipped_without_the_section(demo_lm: Path, tmp_path: Path) -> None:
    from paritygate.gate import Gate
    from paritygate.load import config_from_dict

    data = variant_config(demo_lm, tmp_path, None)
    data["name"] = "bp"
    result = Gate(config_from_dict(data, tmp_path / "gate.yaml")).evaluate("behaviour_parity",
                                                                           golden=False)
    assert result.status == "skip" and "causal_lm.behaviour" in result.message


@pytest.mark.parametrize(("behaviour", "key"), [
    ({"samples": 4}, "causal_lm.behaviour.samples"),
    ({"reward_tolerance": 0}, "causal_lm.behaviour.reward_tolerance"),
    ({"format_regex": "("}, "causal_lm.behaviour.format_regex"),
])
def test_bad_settings_name_the_key(demo_lm: Path, tmp_path: Path, behaviour: dict[str, Any],
                                   key: str) -> None:
    from paritygate.errors import InputError
    from paritygate.load import config_from_dict

    data = variant_config(demo_lm, tmp_path, None)
    data["name"] = "bp"
    data["causal_lm"]["behaviour"] = behaviour
    with pytest.raises(InputError) as err:
        config_from_dict(data, tmp_path / "gate.yaml")
    assert key in str(err.value)


def test_reward_function_that_raises_is_bad_input(demo_lm: Path, tmp_path: Path) -> None:
    from paritygate.errors import InputError

    with pytest.raises(InputError) as err:
        _evaluate(demo_lm, tmp_path, None, {"reward_fn": "lm_zoo_rewards:raises", "samples": 8})
    assert "causal_lm.behaviour.reward_fn" in str(err.value)


@pytest.mark.parametrize("serving", [{"temperature": 0.8}, {"stop": []},
                                     {"repetition_penalty": 1.3}])
def test_sampling_config_is_the_root_when_it_names_the_field(demo_lm: Path, tmp_path: Path,
                                                            serving: dict[str, Any]) -> None:
    """Serving temperature 0.8, a missing stop string, a repetition penalty: sampling_config
    names the field and explains the behaviour."""
    from paritygate.gate import Gate
    from paritygate.load import config_from_dict
    from paritygate.rootcause import explain

    data = variant_config(demo_lm, tmp_path, None)
    data["causal_lm"]["behaviour"] = {}
    _sampling(data, "training", tmp_path, **TRAINING)
    _sampling(data, "serving", tmp_path, **{**TRAINING, **serving})
    data["name"] = "bp"
    gate = Gate(config_from_dict(data, tmp_path / "gate.yaml"))
    results = [gate.evaluate(cid, golden=False) for cid in ("sampling_config", "behaviour_parity")]
    assert results[1].status == "fail", results[1].message
    explained, root = explain(results)
    # a penalty moves the served distribution off the policy: that edge comes first
    kind = "off_policy_transform" if "repetition_penalty" in serving else "sampling_protocol"
    assert root is not None and (root.check, root.kind) == ("sampling_config", kind)
    assert {r.id: r.consequence_of for r in explained}["behaviour_parity"] == "sampling_config"


def test_chat_template_that_keeps_greedy_output_is_found(demo_lm: Path, tmp_path: Path) -> None:
    """A serving chat template with a space after the assistant tag (a common template
    mismatch): greedy output is the same (generation_parity passes) but sampled behaviour is
    not; sampling_config cannot name it, so behaviour_parity is the root. The clean twin is
    ``test_clean_twin_passes``."""
    from paritygate.gate import Gate
    from paritygate.load import config_from_dict
    from paritygate.rootcause import explain

    template = tmp_path / "serving-template.jinja"
    template.write_text(
        "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>"
        "{{ message['content'] }}{{ eos_token }}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|> {% endif %}")
    data = variant_config(demo_lm, tmp_path, None)
    data["causal_lm"]["behaviour"] = {}
    data["causal_lm"]["tokenizer"]["serving_chat_template"] = str(template)
    data["name"] = "bp"
    gate = Gate(config_from_dict(data, tmp_path / "gate.yaml"))
    results = [gate.evaluate(cid, golden=False) for cid in ("generation_parity",
                                                            "behaviour_parity")]
    assert results[0].status == "pass", results[0].message
    assert results[1].status == "fail" and "logprob_differs" in results[1].finding_kinds(), (
        results[1].message)
    _, root = explain(results)
    assert root is not None and root.check == "behaviour_parity"


def test_too_few_samples_says_the_minimum(demo_lm: Path, tmp_path: Path) -> None:
    from paritygate.errors import InputError
    from paritygate.load import config_from_dict

    data = variant_config(demo_lm, tmp_path, None)
    data["name"] = "bp"
    data["causal_lm"]["behaviour"] = {"samples": 4}
    with pytest.raises(InputError) as err:
        config_from_dict(data, tmp_path / "gate.yaml")
    assert "causal_lm.behaviour.samples" in str(err.value), str(err.value)
    assert "greater than or equal to 8" in str(err.value), str(err.value)
