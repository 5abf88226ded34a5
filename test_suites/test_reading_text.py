"""The text parsers of the bounded reader: depth measured without recursion, one bounded line
at a time, YAML depth and aliases bounded, every failure an InputError naming file and line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paritygate.errors import InputError
from paritygate.reading_text import (
    MAX_NESTING_DEPTH,
    iter_json_lines,
    nesting_depth,
    parse_json,
    parse_yaml,
    read_json_object,
)


@pytest.mark.parametrize(("text", "depth"), [
    ("{}", 1), ("[1, [2, [3]]]", 3), ('{"a": "[[[[[["}', 1), ('["\\"[[[", [[]]]', 3),
    ("[" * 150 + "]" * 150, 150), ('{"k": [' + "{}, " * 5000 + "{}]}", 3), ("1", 0),
    ("[" * 10**5, MAX_NESTING_DEPTH + 1), ("[" * 10**5 + "]" * 10**5, MAX_NESTING_DEPTH + 1),
])
def test_nesting_depth_matches_the_structure(text: str, depth: int) -> None:
    assert nesting_depth(text.encode()) == depth


def test_depth_agrees_with_the_parser_on_real_shapes() -> None:
    """Records of the shapes the gate reads: the measured depth is the parsed one."""
    def parsed_depth(v: object) -> int:
        if isinstance(v, dict):
            return 1 + max((parsed_depth(x) for x in v.values()), default=0)
        if isinstance(v, list):
            return 1 + max((parsed_depth(x) for x in v), default=0)
        return 0

    record = {"prompt_ids": [1, 2], "top_logprobs": [{"7": -0.1, "[": -2.0}] * 300,
              "sampling": {"stop": ["]]]", "{{"]}}
    raw = json.dumps(record).encode()
    assert nesting_depth(raw) == parsed_depth(record) == 3


def test_too_deep_json_is_refused_before_parsing(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"a": ' + "[" * 200_000 + "]" * 200_000 + "}")
    with pytest.raises(InputError, match="nests deeper than 200") as err:
        read_json_object(path, "causal_lm.model_dir", what="config.json")
    assert err.value.key == "causal_lm.model_dir"
    with pytest.raises(InputError, match="not UTF-8"):
        parse_json(b'{"a": "\xff"}', path, None, what="config.json")


def test_json_lines_name_the_line_and_bound_each_one(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"a": 1}\n\n' + b'{"b": "' + b"x" * 200 + b'"}\n')
    with pytest.raises(InputError, match="longer than 100 bytes") as err:
        list(iter_json_lines(path, "k", what="log", max_line_bytes=100))
    assert err.value.key == "k: line 3"
    assert [n for n, _ in iter_json_lines(path, "k", what="log")] == [1, 3]
    with pytest.raises(InputError, match="more than 1 records"):
        list(iter_json_lines(path, "k", what="log", max_records=1, records_bound="B"))
    path.write_bytes(b'{"a": 1}\n\x80\x81\n')
    with pytest.raises(InputError, match="not UTF-8") as err:
        list(iter_json_lines(path, None, what="log"))
    assert err.value.key == "line 2"


def test_yaml_depth_and_aliases_are_bounded(tmp_path: Path) -> None:
    path = tmp_path / "trl.yaml"
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + n)}: &{chr(98 + n)} [{', '.join([f'*{chr(97 + n)}'] * 10)}]\n"
        for n in range(6))
    with pytest.raises(InputError, match="aliases expand"):
        parse_yaml(bomb, path, "causal_lm.sampling.training")
    for deep in ("k: " + "[" * 10**5 + "]" * 10**5, "k: " + "[" * 300 + "]" * 300):
        with pytest.raises(InputError, match="nest"):
            parse_yaml(deep, path)
    assert parse_yaml("k: [1, {a: 2}]\n", path) == {"k": [1, {"a": 2}]}
    with pytest.raises(InputError, match="line 3: invalid YAML"):
        parse_yaml("a: 1\nb: [\n", path)


def test_a_huge_trainer_state_gives_its_head(tmp_path: Path) -> None:
    """A trainer_state.json over MAX_JSON_BYTES is read for its head's global_step and epoch
    (the Trainer writes keys sorted), never parsed whole."""
    import paritygate.trainer_output as trainer_output

    folder = tmp_path / "checkpoint-7"
    folder.mkdir()
    state = {"epoch": 1.5, "global_step": 700, "log_history": [{"loss": 1.0}] * 2000}
    (folder / "trainer_state.json").write_text(json.dumps(state, indent=2, sort_keys=True))
    size = (folder / "trainer_state.json").stat().st_size
    whole = trainer_output._read_state(folder, None)
    assert whole is not None and whole["global_step"] == 700
    original = trainer_output.MAX_JSON_BYTES
    try:
        trainer_output.MAX_JSON_BYTES = size // 2
        assert trainer_output._read_state(folder, None) == {"global_step": 700, "epoch": 1.5}
    finally:
        trainer_output.MAX_JSON_BYTES = original


@pytest.mark.parametrize("weight_map", [[1, 2], {"a": 3}, {"a": "../x.safetensors"}])
def test_a_shard_index_of_another_shape_is_bad_input(tmp_path: Path, weight_map: object) -> None:
    """A ``model.safetensors.index.json`` whose ``weight_map`` is no {tensor: shard file}
    mapping is refused naming it (a list once ended in an AttributeError traceback)."""
    from paritygate.engines.hf_loading import safetensors_files

    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(InputError, match="must map tensor names") as err:
        safetensors_files(tmp_path)
    assert err.value.key == "weight_map"
