"""Hostile paths and sizes through the real CLI: each ends in exit 2 at once, one line.

A FIFO never returns end-of-file, ``/dev/zero`` never ends, and a config can ask for 10^7
recurrent steps or 10^9 steps per episode. Every case here is refused while the config is
loaded (no path a config names may be a FIFO, device or socket; the bounds are the config
models'), so none needs a demo build. Each runs ``paritygate run`` in a child measured by
itself (:mod:`measured_run`): refused before torch is imported, having read far less than a
device or a FIFO would give, within a refusal's CPU time; a loaded machine's wall clock is no
part of it (only a hang guard: a blocked read fails the test instead of the suite).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from measured_run import run_measured

from paritygate.config.policy import (
    MAX_EPISODE_STEPS,
    MAX_EPISODES,
    MAX_RECURRENT_STEPS,
)

ROOT = Path(__file__).resolve().parents[1]
POLICY = ROOT / "configs" / "demo-policy.yaml"
CPU_BOUND_S = 60
"""A refusal at config load costs the CLI's imports (a few CPU seconds)."""


def run_cli(config: Path) -> tuple[int, str, str]:
    """``paritygate run CONFIG`` in a child, which must refuse at config load: before torch is
    imported, having read under 256 MiB, within :data:`CPU_BOUND_S` CPU seconds."""
    run = run_measured(["run", str(config)], config.parent)
    assert "torch" not in run.modules, (run.modules, run.err[-800:])
    assert 0 <= run.read_bytes < 2**28, run.read_bytes
    assert run.cpu_s < CPU_BOUND_S, run.cpu_s
    return run.code, run.out, run.err


def error_line(code: int, out: str, err: str, *, file: str, key: str | None) -> str:
    """Exit 2, no traceback, stderr one ``paritygate: error:`` line naming file and key."""
    assert code == 2, f"exit {code}\nstdout: {out[-800:]}\nstderr: {err[-800:]}"
    assert "Traceback" not in out + err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"stderr must be one line, got: {err[-800:]!r}"
    line = lines[0]
    assert line.startswith("paritygate: error: "), line
    assert file in line, f"{file} not named in: {line}"
    if key is not None:
        assert f": {key}: " in line, f"key {key!r} not named in: {line}"
    return line


def policy_config(folder: Path, edit: dict[str, Any]) -> Path:
    """The committed demo config with ``edit`` (dotted key -> value) applied."""
    data = yaml.safe_load(POLICY.read_text(encoding="utf-8"))
    for dotted, value in edit.items():
        node = data
        *parents, last = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    path = folder / "gate.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def fifo(folder: Path, name: str) -> Path:
    path = folder / name
    os.mkfifo(path)
    return path


def dev_zero(folder: Path, name: str) -> Path:
    path = folder / name
    path.symlink_to("/dev/zero")
    return path


RECURRENT = {"states": [{"input": "h", "output": "h_out", "shape": [4]}]}

SPECIAL_PATHS: list[tuple[str, str, str, Any]] = [
    # (case id, file name, config key its path goes under, how the special file is made)
    ("fifo-checkpoint", "policy.safetensors", "policy.checkpoint", fifo),
    ("fifo-pt-checkpoint", "policy.pt", "policy.checkpoint", fifo),
    ("dev-zero-checkpoint", "policy.safetensors", "policy.checkpoint", dev_zero),
    ("dev-zero-pt-checkpoint", "policy.pt", "policy.checkpoint", dev_zero),
    ("fifo-artifact", "policy.onnx", "policy.artifact", fifo),
    ("fifo-probes", "probes.npz", "policy.probes.file", fifo),
    ("dev-zero-probes", "probes.npz", "policy.probes.file", dev_zero),
    ("fifo-stats", "obs_norm.json", "policy.preprocessing.stats", fifo),
    ("fifo-initial-state", "h0.npy", "policy.recurrent.states[0].initial", fifo),
    ("fifo-manifest", "manifest.json", "policy.manifest", fifo),
]


@pytest.mark.parametrize(("file", "key", "make"), [c[1:] for c in SPECIAL_PATHS],
                         ids=[c[0] for c in SPECIAL_PATHS])
def test_special_file_as_an_input_path_is_refused_at_once(
    tmp_path: Path, file: str, key: str, make: Any
) -> None:
    special = make(tmp_path, file)
    edit: dict[str, Any] = {}
    if key == "policy.probes.file":
        edit["policy.probes"] = {"file": str(special)}
    elif key.startswith("policy.recurrent"):
        edit["policy.output_names"] = ["logits", "h_out"]
        edit["policy.recurrent"] = {"states": [{**RECURRENT["states"][0],
                                                "initial": str(special)}]}
    else:
        edit[key] = str(special)
    code, out, err = run_cli(policy_config(tmp_path, edit))
    line = error_line(code, out, err, file=str(special), key=key)
    kind = "FIFO" if make is fifo else "character device"
    assert kind in line and "only regular files" in line, line


@pytest.mark.parametrize("make", [fifo, dev_zero], ids=["fifo", "dev-zero"])
def test_the_config_itself_as_a_special_file(tmp_path: Path, make: Any) -> None:
    config = make(tmp_path, "gate.yaml")
    code, out, err = run_cli(config)
    line = error_line(code, out, err, file="gate.yaml", key=None)
    assert "config file is a" in line, line


BOUNDS: list[tuple[str, dict[str, Any], str, int]] = [
    ("recurrent-steps-1e7", {"policy.output_names": ["logits", "h_out"],
                             "policy.recurrent": {**RECURRENT, "steps": 10_000_000}},
     "policy.recurrent.steps", MAX_RECURRENT_STEPS),
    ("rollout-episodes-1e5", {"policy.rollout": {"env": "CartPole-v1", "episodes": 100_000}},
     "policy.rollout.episodes", MAX_EPISODES),
    ("rollout-max-steps-1e9", {"policy.rollout": {"env": "CartPole-v1",
                                                  "max_steps": 1_000_000_000}},
     "policy.rollout.max_steps", MAX_EPISODE_STEPS),
    ("rollout-seeds-1e5", {"policy.rollout": {"env": "CartPole-v1",
                                              "seeds": list(range(100_000))}},
     "policy.rollout.seeds", MAX_EPISODES),
]


@pytest.mark.parametrize(("edit", "key", "bound"), [c[1:] for c in BOUNDS],
                         ids=[c[0] for c in BOUNDS])
def test_run_length_bounds_name_the_key(
    tmp_path: Path, edit: dict[str, Any], key: str, bound: int
) -> None:
    """10^7 recurrent steps, 10^5 episodes or seeds, 10^9 steps per episode: refused by
    the documented bound, naming the key; a 10^5 seeds list (no alias in the file) is not
    blamed on YAML aliases."""
    config = policy_config(tmp_path, edit)
    code, out, err = run_cli(config)
    line = error_line(code, out, err, file="gate.yaml", key=key)
    assert str(bound) in line, line
    assert "aliases" not in line, line


def test_bounds_are_documented_in_the_readme() -> None:
    readme = (ROOT / "docs" / "limits.md").read_text(encoding="utf-8")
    for name, value in (("MAX_RECURRENT_STEPS", MAX_RECURRENT_STEPS),
                        ("MAX_EPISODES", MAX_EPISODES),
                        ("MAX_EPISODE_STEPS", MAX_EPISODE_STEPS)):
        assert f"{value:,}" in readme or str(value) in readme, name
    from paritygate import reading

    for name in ("MAX_ARRAY_BYTES", "MAX_DUMP_BYTES", "MAX_CONFIG_BYTES", "SPARSE_MIN_BYTES",
                 "MAX_ZIP_RATIO"):
        assert name in readme, f"{name} ({getattr(reading, name)}) is not in the README"


def test_every_reader_of_arrays_and_checkpoints_goes_through_paritygate_reading() -> None:
    """``paritygate.reading`` is the ground floor (it imports only ``paritygate.errors``);
    ``np.load`` lives only there, ``torch.load`` only in ``checkpoints`` (which checks the
    file through it), and every module that opens safetensors or reads a user's file imports
    it."""
    import ast

    sys.path.insert(0, str(Path(__file__).parent))
    from test_architecture import SRC, import_graph

    graph = import_graph()
    assert graph["paritygate.reading"] <= {"paritygate.errors"}
    np_loads = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
                      if "np.load(" in p.read_text("utf-8") and p.name != "reading.py")
    assert np_loads == [], "np.load belongs in paritygate.reading (load_arrays)"
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text("utf-8"))
        calls = {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
        if "torch.load" in calls:
            assert path.name == "checkpoints.py", path
    for user in ("paritygate.load", "paritygate.checkpoints", "paritygate.golden",
                 "paritygate.engines.rollout_dump", "paritygate.engines.hf_loading",
                 "paritygate.families.policy.probes", "paritygate.families.policy.build",
                 "paritygate.families.causal_lm.probes", "paritygate.families.causal_lm.sampling",
                 "paritygate.families.causal_lm.tokenizer", "paritygate.families.causal_lm.weights",
                 "paritygate.families.hf_model.probes", "paritygate.families.hf_model.context",
                 "paritygate.init", "paritygate.init_hf"):
        assert "paritygate.reading" in graph[user], f"{user} does not read through it"


def test_config_over_its_size_bound_is_refused_unparsed(tmp_path: Path) -> None:
    from paritygate.reading import MAX_CONFIG_BYTES

    config = policy_config(tmp_path, {})
    with open(config, "a", encoding="utf-8") as fh:
        fh.write("# padding\n" * (MAX_CONFIG_BYTES // 10 + 1))
    code, out, err = run_cli(config)
    line = error_line(code, out, err, file="gate.yaml", key=None)
    assert "MAX_CONFIG_BYTES" in line, line


def test_sparse_config_is_refused(tmp_path: Path) -> None:
    """A config file is judged like every input: a sparse one (a few bytes written at the
    end of 3 GiB of holes) never reaches the YAML parser."""
    config = tmp_path / "gate.yaml"
    with open(config, "wb") as fh:
        fh.truncate(3 * 2**30)
    code, out, err = run_cli(config)
    line = error_line(code, out, err, file="gate.yaml", key=None)
    assert "config file is" in line, line


@pytest.mark.parametrize("where", ["checkpoint", "output_dir"])
def test_a_fifo_trainer_state_in_an_output_dir_never_blocks(tmp_path: Path, where: str) -> None:
    """The trainer-output resolution runs before the special-file refusal: a FIFO named
    ``trainer_state.json`` (in ``checkpoint-N`` or at the output_dir's top) is passed over
    without opening it, and the model directory check then names it (exit 2, not a hang)."""
    import signal

    from paritygate.errors import InputError
    from paritygate.reading import check_input
    from paritygate.trainer_output import resolve_checkpoint

    out = tmp_path / "out"
    checkpoint = out / "checkpoint-3"
    checkpoint.mkdir(parents=True)
    (checkpoint / "config.json").write_text("{}", encoding="utf-8")
    fifo(checkpoint if where == "checkpoint" else out, "trainer_state.json")

    def hung(*_: Any) -> None:
        raise TimeoutError("a FIFO trainer_state.json was opened")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(10)
    try:
        record = resolve_checkpoint(out, key="causal_lm.model_dir")
        direct = resolve_checkpoint(checkpoint, key="--checkpoint")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert record is not None and direct is not None
    assert record.path == checkpoint and (record.step, record.step_source) == (3, "folder name")
    assert "trainer_state.json" not in record.trainer_files
    if where == "checkpoint":
        refused = r"trainer_state\.json in the model directory is a FIFO"
        with pytest.raises(InputError, match=refused):
            check_input(record.path, "causal_lm.model_dir", what="model directory", expect="dir")
