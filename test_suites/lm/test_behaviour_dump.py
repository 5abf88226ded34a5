"""``behaviour_parity`` on rollout dumps: each side's samples read from shards (a glob or a
list) in streaming batches, as a distributed engine writes them. The clean twin (two dumps
sampled under the same config) passes; a serving dump sampled at temperature 0.8 fails with
its named kind; a dump without a field a statistic needs is bad input naming file, line and
field; the sharded reader never holds more than one batch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from lm_zoo import _sampling, variant_config

SHARDS = 3


def _gate(demo_lm: Path, out: Path, behaviour: dict[str, Any], **serving: Any) -> Any:
    from paritygate.gate import Gate
    from paritygate.load import config_from_dict

    data = variant_config(demo_lm, out, None)
    data["causal_lm"]["behaviour"] = behaviour
    if serving:
        _sampling(data, "serving", out, **serving)
    data["name"] = "bp"
    return Gate(config_from_dict(data, out / "gate.yaml"))


def _write_shards(demo_lm: Path, out: Path, side: str, **serving: Any) -> list[Path]:
    """Sample ``side`` with the engine the check would use and write it as JSONL shards,
    a prompt's samples in one shard (as a data-parallel engine writes them)."""
    gate = _gate(demo_lm, out, {"samples": 64}, **serving)
    setup: Any = gate.context.behaviour
    source = {s.side.name: s for s in setup.sources}[side]
    prompts = [p for p in source.side.prompts if p]
    draws = [d for batch in setup.sampled(source, prompts) for d in batch]
    folder = out / f"{side}-dump"
    folder.mkdir()
    paths = [folder / f"shard-{k}.jsonl" for k in range(SHARDS)]
    per_prompt = 64
    for k, path in enumerate(paths):
        rows = [d for i, d in enumerate(draws) if (i // per_prompt) % SHARDS == k]
        path.write_text("".join(json.dumps({
            "prompt_ids": list(d.prompt_ids), "completion_ids": d.completion_ids,
            "finish_reason": d.reason, "engine": "vllm-dp"}) + "\n" for d in rows))
    return paths


@pytest.fixture(scope="module")
def dumps(demo_lm: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    root = tmp_path_factory.mktemp("behaviour-dumps")
    made = {}
    for name, side, serving in (("training", "training", {}), ("serving", "serving", {}),
                                ("hot", "serving", {"temperature": 0.8})):
        out = root / name
        out.mkdir()
        made[name] = _write_shards(demo_lm, out, side, **serving)
    return made


def test_clean_dumps_pass_from_a_glob_and_a_list(demo_lm: Path, tmp_path: Path,
                                                  dumps: dict[str, list[Path]]) -> None:
    glob = str(dumps["training"][0].parent / "shard-*.jsonl")
    gate = _gate(demo_lm, tmp_path, {"training_dump": glob,
                                     "serving_dump": [str(p) for p in dumps["serving"]],
                                     "batch_size": 16})
    result = gate.evaluate("behaviour_parity", golden=False)
    assert result.status == "pass", result.message
    records = {side: sum(len(p.read_text().splitlines()) for p in dumps[side])
               for side in ("training", "serving")}
    assert result.details["samples"] == records
    assert "3 dump file(s)" in result.details["sources"]["training"]


def test_hot_serving_dump_fails_named(demo_lm: Path, tmp_path: Path,
                                      dumps: dict[str, list[Path]]) -> None:
    gate = _gate(demo_lm, tmp_path, {"training_dump": [str(p) for p in dumps["training"]],
                                     "serving_dump": [str(p) for p in dumps["hot"]]})
    result = gate.evaluate("behaviour_parity", golden=False)
    assert result.status == "fail" and "logprob_differs" in result.finding_kinds(), result.message


@pytest.mark.parametrize(("drop", "field"), [("finish_reason", "finish_reason"),
                                             ("completion_ids", "completion_ids")])
def test_dump_missing_a_field_names_file_line_and_field(
        demo_lm: Path, tmp_path: Path, dumps: dict[str, list[Path]], drop: str,
        field: str) -> None:
    from paritygate.errors import InputError

    bad = tmp_path / "bad.jsonl"
    lines = dumps["serving"][0].read_text().splitlines()
    rec = json.loads(lines[2])
    del rec[drop]
    lines[2] = json.dumps(rec)
    bad.write_text("\n".join(lines) + "\n")
    gate = _gate(demo_lm, tmp_path, {"training_dump": [str(p) for p in dumps["training"]],
                                     "serving_dump": str(bad)})
    with pytest.raises(InputError) as err:
        gate.evaluate("behaviour_parity", golden=False)
    assert str(bad) in str(err.value) and f"line 3: {field}" in str(err.value)


def test_glob_matching_nothing_names_the_key(demo_lm: Path, tmp_path: Path) -> None:
    from paritygate.errors import InputError

    gate = _gate(demo_lm, tmp_path, {"training_dump": str(tmp_path / "none-*.jsonl"),
                                     "serving_dump": str(tmp_path / "none-*.jsonl")})
    with pytest.raises(InputError) as err:
        gate.evaluate("behaviour_parity", golden=False)
    assert "causal_lm.behaviour.training_dump" in str(err.value)


def test_reader_streams_one_batch_at_a_time(tmp_path: Path) -> None:
    """Batches of at most ``batch`` records, over shards in order, read lazily: the
    generator has consumed only what it yielded."""
    from paritygate.engines.dump_stream import stream_draws

    paths = []
    for k in range(3):
        path = tmp_path / f"s{k}.jsonl"
        path.write_text("".join(json.dumps({"prompt_ids": [1, k], "completion_ids": [i],
                                            "finish_reason": "length"}) + "\n"
                                for i in range(10)))
        paths.append(path)
    stream = stream_draws(paths, batch=4)
    first = next(stream)
    assert [d.completion_ids for d in first] == [[0], [1], [2], [3]]
    rest = list(stream)
    assert [len(b) for b in rest] == [4] * 6 + [2]
    assert rest[-1][-1].prompt_ids == (1, 2)


def test_vllm_stop_reason_maps_to_stop_string_or_eos(tmp_path: Path) -> None:
    from paritygate.engines.dump_stream import to_draw

    base = {"prompt_ids": [1], "completion_ids": [2], "finish_reason": "stop"}
    assert to_draw(tmp_path, "line 1", {**base, "stop_reason": "\n\n"}, None).reason == "stop"
    assert to_draw(tmp_path, "line 1", {**base, "stop_reason": None}, None).reason == "eos"
    assert to_draw(tmp_path, "line 1", base, None).reason == "stop"


def test_each_side_is_a_source_of_the_setup(demo_lm: Path, tmp_path: Path) -> None:
    """The check treats the two sides alike: each is a source of its setup (the side, its dump
    key, the engine that samples it); the trainer's side samples on HF, the served side on the
    engine the config names."""
    ctx: Any = _gate(demo_lm, tmp_path, {"samples": 8}).context
    training, serving = ctx.behaviour.sources
    assert (training.side, serving.side) == (ctx.training, ctx.serving)
    assert (training.engine, serving.engine) == ("hf", "hf")  # engines: [hf]
    assert (training.dump, serving.dump) == (None, None)
    assert [s.key for s in (training, serving)] == ["causal_lm.behaviour.training_dump",
                                                    "causal_lm.behaviour.serving_dump"]
    assert ctx.behaviour.kept() == {i for i, p in enumerate(ctx.training.prompts) if p}
