"""What ``paritygate init`` infers about a policy's inputs: ``policy.inputs`` for an artifact
with several inputs or an SB3 ``Dict`` observation space, and ``policy.recurrent`` for state
inputs fed back from state outputs (pairs guessed by name, ``h_in`` / ``h_out``).

Pure name and shape logic over what the ONNX graph and the SB3 zip's ``data`` JSON declare;
nothing here loads a model or unpickles anything.
"""

from __future__ import annotations

import json
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paritygate.reading import read_zip_member

if TYPE_CHECKING:
    from paritygate.init_yaml import Block

_DIRECTION_WORDS = frozenset({"in", "out", "input", "output", "inputs", "outputs", "prev",
                              "next", "new", "old", "last", "current", "cur"})
"""Name parts that say which side of a step a state is on; removed to pair ``h_in``/``h_out``."""
_START_NAMES = frozenset({"episode_start", "episode_starts", "episodestart", "start", "starts",
                          "done", "dones", "reset", "resets", "first", "is_first", "is_init",
                          "first_step", "new_episode"})
"""Input names of an episode-start flag (1.0 where the model resets its state)."""


def row_shape(dims: list[Any]) -> list[int] | None:
    """The per-row shape of an ONNX input or output (batch axis 0 dropped); ``None`` when a
    dimension past the batch is symbolic or unknown."""
    rest = list(dims[1:])
    return [int(d) for d in rest] if all(isinstance(d, int) and d > 0 for d in rest) else None


def _stem(name: str) -> tuple[str, ...]:
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]
    return tuple(w for w in words if w not in _DIRECTION_WORDS)


@dataclass
class InputLayout:
    """The artifact's inputs sorted by role: observations (name, per-row shape), state pairs
    (input, output, per-row shape), the episode-start flag, and what could not be paired."""

    observations: list[tuple[str, list[int] | None]] = field(default_factory=list)
    states: list[tuple[str, str, list[int] | None]] = field(default_factory=list)
    episode_start: str | None = None
    order: list[str] = field(default_factory=list)

    @property
    def recurrent(self) -> bool:
        return bool(self.states)

    @property
    def several(self) -> bool:
        return len(self.order) > 1


def layout(inputs: list[tuple[str, list[Any]]], outputs: list[str]) -> InputLayout:
    """Sort the artifact's inputs: an input whose name matches a non-policy output's up to
    direction words (``h_in``/``h_out``, ``state_in_c``/``state_out_c``, ``prev_h``/``next_h``)
    is a state; a scalar-per-row input named like an episode start is the reset flag."""
    found = InputLayout(order=[name for name, _ in inputs])
    free = {_stem(o): o for o in outputs[1:]}
    for name, dims in inputs:
        stem = _stem(name)
        shape = row_shape(dims)
        if stem and stem in free and free[stem] != name:
            found.states.append((name, free.pop(stem), shape))
        elif found.episode_start is None and name.lower() in _START_NAMES and not shape:
            found.episode_start = name
        else:
            found.observations.append((name, shape))
    if not found.states and found.episode_start is not None:
        # a flag without state is an observation like any other
        found.observations = [(n, row_shape(d)) for n, d in inputs]
        found.episode_start = None
    return found


MAX_SB3_DATA_BYTES = 64 * 2**20
"""An SB3 zip's ``data`` member (JSON of the spaces and hyper-parameters, a few kB) is read
only up to this size."""


def sb3_dict_spaces(checkpoint: Path) -> dict[str, list[int] | None] | None:
    """The keys and shapes of an SB3 zip's ``Dict`` observation space, read from the readable
    ``spaces`` text of its ``data`` JSON (the pickled space is never loaded); ``None`` when the
    space is not a ``Dict``. A key that is not a ``Box`` has shape ``None``."""
    try:
        with zipfile.ZipFile(checkpoint) as zf:
            data = json.loads(read_zip_member(zf, "data", checkpoint, None, what="member",
                                              max_bytes=MAX_SB3_DATA_BYTES))
    except (KeyError, OSError, ValueError, zipfile.BadZipFile):
        return None
    space = data.get("observation_space") if isinstance(data, dict) else None
    if not isinstance(space, dict) or "spaces.dict.Dict" not in str(space.get(":type:", "")):
        return None
    text = str(space.get("spaces", ""))
    keys: dict[str, list[int] | None] = {}
    for key, body in re.findall(r"'([^']+)':\s*(\w+\((?:[^()]|\([^()]*\))*\))", text):
        box = re.fullmatch(r"Box\([^,]+,\s*[^,]+,\s*\(([\d,\s]*)\),\s*\w+\)", body)
        keys[key] = ([int(d) for d in box.group(1).replace(" ", "").split(",") if d]
                     if box else None)
    return keys


def _shape_value(shape: list[int] | None, what: str) -> object:
    from paritygate.init_yaml import todo_value

    return shape if shape is not None else todo_value(
        f"the per-row shape of {what} (without the batch axis)")


def inputs_block(policy: Block, found: InputLayout, source: str, call: str | None) -> None:
    """``policy.call``, ``policy.inputs`` and, for state pairs, ``policy.recurrent``."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    from paritygate.init_yaml import flow

    if call is not None:
        policy.set("call", call)
    elif not found.recurrent or len(found.observations) > 1:
        policy.todo("call", "dict | keyword | positional: how the torch forwards take the inputs")
    else:
        policy.set("call", "positional", "forward(obs, state..., flag): the default; review")
    state_names = {s[0] for s in found.states} | {found.episode_start}
    shapes = dict(found.observations)
    entries = CommentedSeq()
    for name in found.order:
        if name in state_names:
            entries.append(name)
            continue
        entry = CommentedMap(name=name, shape=flow(_shape_value(shapes.get(name), repr(name))))
        entry.yaml_add_eol_comment("preprocessing: {training: ..., serving: ..., stats: ...}: "
                                   "this input's own, if any", "shape")
        entries.append(entry)
    policy.set("inputs", entries, f"call order, from {source}", block=True)
    if not found.recurrent:
        return
    recurrent = policy.block("recurrent", "state pairs guessed from the names: review")
    states = CommentedSeq()
    for i, (inp, out, shape) in enumerate(found.states):
        states.append(flow({"input": inp, "output": out,
                            "shape": _shape_value(shape, repr(inp))}))
        states.yaml_add_eol_comment("initial: 0.0; training_output: the position of output in "
                                    "output_names", i)
    recurrent.set("states", states, block=True)
    if found.episode_start is not None:
        recurrent.set("episode_start", found.episode_start, "1.0 at an episode's first step")
    else:
        recurrent.comment("episode_start: none found: the gate feeds the initial state at "
                          "every episode start")
