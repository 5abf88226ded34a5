"""``sampling_config`` compares a tokenizer's padding and truncation side only where the
serving engine pads a batch (HF generate): vLLM and an endpoint run each prompt alone, so a
serving tokenizer that pads on the right is no protocol difference there (the trainer's
``padding_side: left`` against a tokenizer saved with the default ``right`` was a false
alarm on a served model). A serving sampling file that states the side is still compared."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from lm_zoo import FAULTS, variant_config


@pytest.mark.parametrize(("engines", "stated", "status"),
                         [(["hf"], False, "fail"), (["vllm"], False, "pass"),
                          (["vllm"], True, "fail")])
def test_padding_side_is_compared_where_the_serving_engine_pads(
        demo_lm: Path, tmp_path: Path, engines: list[str], stated: bool, status: str) -> None:
    from paritygate.gate import Gate
    from paritygate.load import config_from_dict

    fault = next(f for f in FAULTS if f.name == "right_padding")
    data = variant_config(demo_lm, tmp_path, fault)
    data["causal_lm"]["engines"] = engines
    if stated:
        serving = yaml.safe_load(Path(data["causal_lm"]["sampling"]["serving"]).read_text())
        serving["padding_side"] = "right"
        (tmp_path / "serving.yaml").write_text(yaml.safe_dump(serving))
        data["causal_lm"]["sampling"]["serving"] = str(tmp_path / "serving.yaml")
    result = Gate(config_from_dict(data, tmp_path / "gate.yaml")).evaluate(
        "sampling_config", golden=False)
    assert result.status == status, result.message
    if status == "fail":
        assert result.finding_kinds() == ["field_differs"]
        assert "padding_side differs" in result.message
    else:
        assert "not compared: padding_side, truncation_side" in " ".join(result.details["notes"])
