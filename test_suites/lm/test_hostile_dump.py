"""Hostile causal-LM inputs: a rollout dump that breaks its published schema is bad input, not
a verdict, and so is a FIFO inside the model directory.

Through the real CLI (``engines: [dump]``): a FIFO or a 2 GiB sparse file as the dump, an
out-of-vocabulary token id, a NaN, -Infinity or positive log-prob and a negative temperature
each end in exit 2 with one line naming the dump, the line and the field; the records are
validated before any tokenizer or model loads (the run never imports transformers), and the
sparse file is refused unread (the run reads far less than it holds). Measured by the run
itself (:mod:`measured_run`), so a loaded machine cannot fail them; wall time is only a hang
guard.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from lm_zoo import clean_config
from measured_run import MeasuredRun, run_measured

from paritygate.engines.rollout_dump import DUMP_RECORD_SCHEMA, read_dump
from paritygate.errors import InputError

CPU_BOUND_S = 60
"""A refusal costs the CLI's imports and a config load (about 3 CPU seconds); a run that loads
and scores the model costs far more."""
GOOD = {"prompt_ids": [1, 5, 6], "completion_ids": [7, 2], "logprobs": [-0.5, -0.1],
        "sampling": {"temperature": 0.7}}

BAD_RECORDS: list[tuple[str, dict[str, Any], str, str]] = [
    # (case id, record on line 2, field named, words of the cause)
    ("oov-completion-id", {**GOOD, "completion_ids": [7, 100_000]}, "completion_ids",
     "outside the model's vocabulary"),
    ("oov-prompt-id", {**GOOD, "prompt_ids": [1, 100_000]}, "prompt_ids",
     "outside the model's vocabulary"),
    ("nan-logprob", {**GOOD, "logprobs": [-0.5, float("nan")]}, "logprobs", "finite"),
    ("neg-inf-logprob", {**GOOD, "logprobs": [float("-inf"), -0.1]}, "logprobs", "finite"),
    ("positive-logprob", {**GOOD, "logprobs": [0.5, -0.1]}, "logprobs", "must be <= 0"),
    ("negative-temperature", {**GOOD, "sampling": {"temperature": -0.7}},
     "sampling.temperature", "out of range"),
    ("nan-top-logprob", {**GOOD, "top_logprobs": [{"7": float("nan")}, {"2": -0.1}]},
     "top_logprobs", "not NaN"),
]


def _dump(folder: Path, bad: dict[str, Any]) -> Path:
    path = folder / "dump.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps(bad) + "\n", encoding="utf-8")
    return path


def _config(folder: Path, model: Path, dump: Path) -> Path:
    data = clean_config(model)
    data["golden"] = {"dir": str(folder / "golden")}
    data["causal_lm"]["engines"] = ["dump"]
    data["causal_lm"]["engine"]["dump"] = str(dump)
    path = folder / "gate.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def _run(config: Path) -> MeasuredRun:
    return run_measured(["run", str(config)], config.parent)


def _line(run: MeasuredRun, dump: Path, key: str) -> str:
    """Exit 2 with one line naming the dump and ``key``, refused before a tokenizer or model
    loads (transformers never imported) and within a refusal's CPU time."""
    code, out, err = run.code, run.out, run.err
    assert code == 2, f"exit {code}\nstdout: {out[-800:]}\nstderr: {err[-800:]}"
    assert "transformers" not in run.modules, run.modules
    assert run.cpu_s < CPU_BOUND_S, run.cpu_s
    assert "Traceback" not in out + err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("paritygate: error: "), err[-800:]
    assert str(dump) in lines[0] and key in lines[0], lines[0]
    assert "logprob_fn" not in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(("record", "field", "cause"), [c[1:] for c in BAD_RECORDS],
                         ids=[c[0] for c in BAD_RECORDS])
def test_bad_dump_record_is_bad_input_naming_line_and_field(
    demo_lm: Path, tmp_path: Path, record: dict[str, Any], field: str, cause: str
) -> None:
    dump = _dump(tmp_path, record)
    line = _line(_run(_config(tmp_path, demo_lm, dump)), dump,
                 f"causal_lm.engine.dump: line 2: {field}: ")
    assert cause in line, line


@pytest.mark.parametrize("kind", ["fifo", "sparse-2GiB"])
def test_hostile_dump_file_is_refused_unread(demo_lm: Path, tmp_path: Path, kind: str) -> None:
    dump = tmp_path / "dump.jsonl"
    if kind == "fifo":
        os.mkfifo(dump)
    else:
        with open(dump, "wb") as fh:
            fh.truncate(2 * 2**30)
    run = _run(_config(tmp_path, demo_lm, dump))
    line = _line(run, dump, "causal_lm.engine.dump: ")
    assert ("FIFO" in line) if kind == "fifo" else ("MAX_DUMP_BYTES" in line), line
    assert run.read_bytes < 2**28, run.read_bytes  # imports and config: tens of MB, not 2 GiB


@pytest.mark.parametrize(("record", "field", "cause"), [c[1:] for c in BAD_RECORDS],
                         ids=[c[0] for c in BAD_RECORDS])
def test_read_dump_names_the_field(
    tmp_path: Path, record: dict[str, Any], field: str, cause: str
) -> None:
    with pytest.raises(InputError) as err:
        read_dump(_dump(tmp_path, record), vocab_size=512)
    assert err.value.key == f"line 2: {field}"
    assert cause in err.value.cause


def test_published_schema_refuses_what_it_can_state() -> None:
    """The records JSON Schema can judge (a range, not finiteness or the model's vocabulary)
    are refused by ``schemas/rollout_dump.schema.json`` too; the good record passes."""
    jsonschema = pytest.importorskip("jsonschema")
    published = json.loads((Path(__file__).resolve().parents[2] / "schemas"
                            / "rollout_dump.schema.json").read_text(encoding="utf-8"))
    assert published == json.loads(json.dumps(DUMP_RECORD_SCHEMA))
    jsonschema.validate(GOOD, published)
    for case_id, record, _, _ in BAD_RECORDS:
        if case_id in ("positive-logprob", "negative-temperature"):
            with pytest.raises(jsonschema.ValidationError):
                jsonschema.validate(record, published)


def test_parquet_dump_declaring_more_than_the_bound_is_refused_undecompressed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Parquet dump is judged by the uncompressed size its footer declares: 2,000 equal
    records are 4 kB on disk and 55 kB declared; with the bound between the two, refused."""
    pytest.importorskip("pyarrow")
    import paritygate.engines.rollout_dump as rollout_dump

    record = {"prompt_ids": [1, 2] * 50, "completion_ids": [3] * 100, "logprobs": [-0.1] * 100}
    path = rollout_dump.write_dump(tmp_path / "dump.parquet", [record] * 2000)
    assert path.stat().st_size < 20_000
    monkeypatch.setattr(rollout_dump, "MAX_DUMP_BYTES", 20_000)
    with pytest.raises(InputError) as err:
        read_dump(path)
    assert "declares" in err.value.cause and "MAX_DUMP_BYTES" in err.value.cause


@pytest.mark.parametrize("name", ["tokenizer.json", "config.json"])
def test_fifo_inside_the_model_directory(demo_lm: Path, tmp_path: Path, name: str) -> None:
    """A loader reads a model directory's files by name: a FIFO among them is named (the file
    and ``causal_lm.model_dir``) before any of them is opened."""
    import shutil

    model = tmp_path / "model"
    shutil.copytree(demo_lm, model)
    (model / name).unlink()
    os.mkfifo(model / name)
    data = clean_config(model)
    data["golden"] = {"dir": str(tmp_path / "golden")}
    config = tmp_path / "gate.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    line = _line(_run(config), model / name, "causal_lm.model_dir: ")
    assert "FIFO" in line, line
