"""Rollout dumps: the schema is validated on load, the HF engine's dump audits clean, and a
dump whose log-probs were perturbed fails with the cause named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from lm_zoo import clean_config

from paritygate.engines.rollout_dump import read_dump, write_dump
from paritygate.errors import InputError
from paritygate.gate import Gate
from paritygate.load import config_from_dict

GOOD = {"prompt_ids": [1, 5, 6], "completion_ids": [7, 2], "logprobs": [-0.5, -0.1]}


def _jsonl(tmp_path: Path, *records: dict) -> Path:
    path = tmp_path / "dump.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.mark.parametrize(
    ("record", "field"),
    [
        ({k: v for k, v in GOOD.items() if k != "logprobs"}, "logprobs"),
        ({**GOOD, "logprobs": [-0.5]}, "logprobs"),
        ({**GOOD, "prompt_ids": []}, "prompt_ids"),
        ({**GOOD, "completion_ids": [7, "x"]}, "completion_ids"),
        ({**GOOD, "tokens": [1]}, "tokens"),
        ({**GOOD, "logprobs_mode": "logits"}, "logprobs_mode"),
        ({**GOOD, "sampling": {"temprature": 1.0}}, "sampling"),
    ],
)
def test_bad_record_names_line_and_field(tmp_path: Path, record: dict, field: str) -> None:
    path = _jsonl(tmp_path, GOOD, record)
    with pytest.raises(InputError) as err:
        read_dump(path)
    assert err.value.key == f"line 2: {field}"


def test_parquet_round_trip(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    rec = {**GOOD, "top_logprobs": [{"7": -0.5, "3": -1.2}, {"2": -0.1}],
           "sampling": {"temperature": 0.7, "max_tokens": 8}, "engine": "vllm"}
    write_dump(tmp_path / "d.parquet", [rec])
    back = read_dump(tmp_path / "d.parquet")[0]
    assert back["completion_ids"] == [7, 2] and back["top_logprobs"][0] == {7: -0.5, 3: -1.2}
    assert back["sampling"].temperature == 0.7 and back["sampling"].max_new_tokens == 8


@pytest.fixture(scope="module")
def hf_dump(demo_lm: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    from paritygate.families.causal_lm.dump import dump_rollouts

    out = tmp_path_factory.mktemp("dump")
    data = clean_config(demo_lm)
    data["name"] = "lm-dump"
    path = dump_rollouts(config_from_dict(data, out / "gate.yaml"), out / "hf.jsonl")
    return path, data


def _audit(data: dict, dump: Path, check_id: str):
    cfg = json.loads(json.dumps(data))
    cfg["causal_lm"]["engines"] = ["dump"]
    cfg["causal_lm"]["engine"]["dump"] = str(dump)
    return Gate(config_from_dict(cfg, dump.parent / "audit.yaml")).evaluate(check_id, golden=False)


def test_hf_dump_audits_clean(hf_dump: tuple[Path, dict]) -> None:
    path, data = hf_dump
    for check_id in ("logprob_delta", "generation_parity"):
        result = _audit(data, path, check_id)
        assert result.status == "pass", f"{check_id}: {result.message}"


def test_perturbed_dump_fails_named(hf_dump: tuple[Path, dict]) -> None:
    path, data = hf_dump
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for rec in records:
        rec["logprobs"] = [min(0.0, v + 0.1) if i % 2 else v for i, v in enumerate(rec["logprobs"])]
    bad = write_dump(path.parent / "perturbed.jsonl", records)
    result = _audit(data, bad, "logprob_delta")
    assert result.status == "fail"
    assert "log-probs disagree beyond the fp32/fp32 tier" in result.message
    assert "engine higher" in result.message or "noise" in result.message


def test_batched_audit_equals_one_batch(hf_dump: tuple[Path, dict],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The audit streams the dump in batches: batches of 3 records give the verdict, the
    diagnosis and the metrics of one batch holding the whole dump."""
    import paritygate.engines.dump_audit as dump_audit

    path, data = hf_dump
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for rec in records[::3]:  # some noise, so the statistics are not all zero
        rec["logprobs"] = [min(0.0, v - 0.01 * (i % 3)) for i, v in enumerate(rec["logprobs"])]
    noisy = write_dump(path.parent / "noisy.jsonl", records)
    whole = {c: _audit(data, noisy, c) for c in ("logprob_delta", "generation_parity")}
    monkeypatch.setattr(dump_audit, "DUMP_BATCH", 3)
    small = {c: _audit(data, noisy, c) for c in ("logprob_delta", "generation_parity")}
    for check_id, expected in whole.items():
        obtained = small[check_id]
        assert obtained.status == expected.status, check_id
        assert obtained.details.get("delta", {}).get("diagnosis") == (
            expected.details.get("delta", {}).get("diagnosis"))
        assert set(obtained.metrics) == set(expected.metrics)
        # The trainer's recompute runs on other padded batches: fp32 rounding of its forward
        # (about 1e-6 relative) is the only difference the batch size may make.
        for name, value in expected.metrics.items():
            assert obtained.metrics[name] == (
                None if value is None else pytest.approx(value, rel=1e-4, abs=1e-9)), name


def test_dump_mixing_logprob_modes_names_the_record(tmp_path: Path) -> None:
    from paritygate.engines.dump_audit import summarise_dump

    path = _jsonl(tmp_path, GOOD, {**GOOD, "logprobs_mode": "raw"})
    with pytest.raises(InputError) as err:
        summarise_dump(path)
    assert err.value.key == "line 2: logprobs_mode"
    summary = summarise_dump(_jsonl(tmp_path, GOOD, {**GOOD, "sampling": {"temperature": 0}}))
    assert (summary.sampled.records, summary.sampled.tokens) == (1, 2)
    assert (summary.greedy.records, summary.greedy.tokens) == (1, 2)
