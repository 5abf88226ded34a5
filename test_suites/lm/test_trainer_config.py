"""The trainer's own TRL config as the training sampling source: the file ``trl grpo --config``
reads maps onto the gate's fields, the serving side of a real GRPO run agrees with it, a
sampling fault in it is named, and what cannot be mapped is listed (or, strict, exit 2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("trl")

TRL_YAML: dict[str, Any] = {
    "model_name_or_path": "grpo_out",
    "dataset_name": "prompts",
    "output_dir": "grpo_out",
    "learning_rate": 1.0e-3,
    "per_device_train_batch_size": 4,
    "num_generations": 2,
    "max_steps": 4,
    "beta": 0.0,
    "use_cpu": True,
    "bf16": False,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": None,
    "repetition_penalty": 1.0,
    "max_completion_length": 8,
    "use_vllm": False,
    "vllm_mode": "colocate",
    "vllm_gpu_memory_utilization": 0.3,
}


@pytest.fixture(scope="session")
def grpo_run(build_once: Any) -> Path:
    import trl_run

    return build_once("grpo-run", trl_run.build, seed=0)


def _gate(run: Path, tmp_path: Path, trl_yaml: dict[str, Any], **sampling: Any) -> Any:
    import trl_run

    from paritygate.gate import Gate
    from paritygate.load import config_from_dict

    path = tmp_path / "grpo.yaml"
    path.write_text(yaml.safe_dump(trl_yaml), encoding="utf-8")
    data = trl_run.gate_config(run)
    data["causal_lm"]["sampling"] = {"training": str(path), **sampling}
    return Gate(config_from_dict(data, tmp_path / "gate.yaml"))


def test_the_file_is_what_trl_reads(tmp_path: Path) -> None:
    from trl import GRPOConfig, ModelConfig, TrlParser
    from trl.scripts.utils import ScriptArguments

    path = tmp_path / "grpo.yaml"
    path.write_text(yaml.safe_dump(TRL_YAML), encoding="utf-8")
    parser = TrlParser((ScriptArguments, GRPOConfig, ModelConfig))
    _, training_args, _ = parser.parse_args_and_config(["--config", str(path)])
    assert training_args.max_completion_length == 8 and training_args.top_k == -1


def test_trl_config_matches_the_served_generation_config(grpo_run: Path, tmp_path: Path) -> None:
    result = _gate(grpo_run, tmp_path, TRL_YAML).evaluate("sampling_config", golden=False)
    assert result.status == "pass", result.message
    notes = " ".join(result.details.get("notes") or [])
    assert "trl (TRL trainer config" in notes and "max_completion_length -> max_new_tokens" in notes
    listed = result.details["not_compared"]
    assert "learning_rate" in listed and "vllm_gpu_memory_utilization" in listed
    assert "vllm_gpu_memory_utilization (the trainer's vLLM engine setting" in notes


@pytest.mark.parametrize(("change", "field"), [
    ({"temperature": 0.7}, "temperature"),
    ({"max_completion_length": 16}, "max_new_tokens"),
    ({"generation_kwargs": {"max_tokens": 4}}, "max_new_tokens"),
    ({"top_k": 20}, "top_k"),
])
def test_a_sampling_fault_in_the_trl_config_is_named(
    grpo_run: Path, tmp_path: Path, change: dict[str, Any], field: str
) -> None:
    result = _gate(grpo_run, tmp_path, {**TRL_YAML, **change}).evaluate(
        "sampling_config", golden=False)
    assert result.status == "fail"
    assert f"{field} differs" in result.message, result.message


def test_absent_fields_take_trl_defaults_and_say_so(grpo_run: Path, tmp_path: Path) -> None:
    trl_yaml = {k: v for k, v in TRL_YAML.items() if k != "max_completion_length"}
    result = _gate(grpo_run, tmp_path, trl_yaml).evaluate("sampling_config", golden=False)
    assert result.status == "fail"
    assert "max_new_tokens differs: training 512 vs serving 8 (TRL's default vs" in result.message


def test_unmappable_fields_are_listed_or_in_strict_mode_exit_2(
    grpo_run: Path, tmp_path: Path
) -> None:
    from paritygate.errors import InputError

    trl_yaml = {**TRL_YAML, "generation_kwargs": {"num_beams": 2},
                "vllm_structured_outputs_regex": "[a-z]+"}
    listed = _gate(grpo_run, tmp_path, trl_yaml).evaluate("sampling_config", golden=False)
    assert {"generation_kwargs.num_beams", "vllm_structured_outputs_regex"} <= set(
        listed.details["not_compared"])
    with pytest.raises(InputError) as err:
        _gate(grpo_run, tmp_path, trl_yaml, strict=True).context  # noqa: B018
    assert err.value.key == "causal_lm.sampling.training: vllm_structured_outputs_regex"
    assert err.value.line().endswith(
        "grpo.yaml: causal_lm.sampling.training: vllm_structured_outputs_regex: cannot map to "
        "the gate's sampling fields: vllm_structured_outputs_regex, generation_kwargs.num_beams "
        "(sampling.strict: true; false lists them in the report instead)")
    with pytest.raises(InputError, match="unknown TRL config field \\(did you mean "
                                         "'temperature'\\?\\)"):
        _gate(grpo_run, tmp_path, {**TRL_YAML, "temprature": 0.7}).context  # noqa: B018


def test_hf_generation_config_as_the_training_source(grpo_run: Path, tmp_path: Path) -> None:
    import trl_run

    from paritygate.gate import Gate
    from paritygate.load import config_from_dict

    data = trl_run.gate_config(grpo_run)
    served = grpo_run / "grpo_out" / "checkpoint-4" / "generation_config.json"
    data["causal_lm"]["sampling"] = {"training": str(served)}
    result = Gate(config_from_dict(data, tmp_path / "gate.yaml")).evaluate(
        "sampling_config", golden=False)
    assert result.status == "pass", result.message
    assert "training sampling config generation_config.json: hf_generation_config" in " ".join(
        result.details.get("notes") or [])
