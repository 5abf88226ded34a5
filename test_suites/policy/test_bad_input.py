"""Bad input ends ``paritygate run`` with exit code 2 and one line naming the file and key.

Every case stops in input validation (building the gate context), before any check
runs: no traceback anywhere in the output, and the checkpoint is never modified.
Most cases call ``paritygate.cli.main`` in-process; the pickle case and a missing
checkpoint also go through the real CLI in a subprocess.
"""

from __future__ import annotations

import hashlib
import os
import pickletools
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from policy_zoo import base_config, merge

from paritygate import cli
from paritygate.checkpoints import PICKLE_REFUSED


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_config(folder: Path, clean: Path, overrides: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    data = merge(base_config(clean), overrides)
    data["golden"] = {"dir": str(folder / "golden")}
    path = folder / "gate.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def run_in_process(capsys: pytest.CaptureFixture[str], config: Path) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli.main(["run", str(config)])
    out, err = capsys.readouterr()
    return code, out, err


def run_subprocess(config: Path, cwd: Path) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("GITHUB_STEP_SUMMARY", "PARITYGATE_CONFIG")}
    proc = subprocess.run([sys.executable, "-m", "paritygate", "run", str(config)], cwd=cwd,
                          capture_output=True, text=True, timeout=300, env=env)
    return proc.returncode, proc.stdout, proc.stderr


def assert_input_error(code: int, out: str, err: str, *, file: Path | str,
                       key: str | None, cause: str) -> str:
    """Exit 2; stderr is one ``paritygate: error: FILE: KEY: cause`` line; no traceback."""
    assert code == 2, f"exit {code}\nstdout: {out}\nstderr: {err}"
    assert "Traceback" not in out + err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"stderr must be one line, got: {err!r}"
    line = lines[0]
    assert line.startswith("paritygate: error: "), line
    assert str(file) in line, f"{file} not named in: {line}"
    if key is not None:
        assert f": {key}: " in line, f"key {key!r} not named in: {line}"
    assert cause in line, f"{cause!r} not in: {line}"
    return line


# --- faulty inputs -------------------------------------------------------------------------------


def _truncated_safetensors(clean: Path, folder: Path) -> Path:
    data = (clean / "policy.safetensors").read_bytes()
    path = folder / "truncated.safetensors"
    path.write_bytes(data[: len(data) // 2])
    return path


def _truncated_pt(clean: Path, folder: Path) -> Path:
    import torch
    from safetensors.torch import load_file

    full = folder / "full.pt"
    torch.save(load_file(str(clean / "policy.safetensors")), full)
    data = full.read_bytes()
    path = folder / "truncated.pt"
    path.write_bytes(data[: len(data) // 2])
    return path


class _Canary:
    """Unpickling this object calls ``open(path, "w")``: it creates the canary file."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[str, str]]:
        return open, (self.path, "w")


def _pickle_checkpoint(clean: Path, folder: Path) -> tuple[Path, Path]:
    """A torch file whose pickle would create ``canary.txt``, and the canary's path."""
    import torch
    from safetensors.torch import load_file

    canary = folder / "canary.txt"
    state: dict[str, Any] = dict(load_file(str(clean / "policy.safetensors")))
    state["_extra"] = _Canary(canary)
    path = folder / "evil.pt"
    torch.save(state, path)
    assert not canary.exists()
    return path, canary


def _pickle_globals(path: Path) -> set[str]:
    """Globals the torch file's pickle would import (read with pickletools, nothing executed)."""
    with zipfile.ZipFile(path) as zf:
        data = zf.read(next(n for n in zf.namelist() if n.endswith("data.pkl")))
    found = set()
    for op, arg, _ in pickletools.genops(data):
        if op.name == "GLOBAL":
            found.add(str(arg).replace(" ", "."))
    return found


def _export_legacy(folder: Path, *, input_name: str = "obs", obs_dim: int = 8) -> Path:
    """A small artifact with another input name or feature width (legacy exporter, fast)."""
    import warnings

    import torch

    from paritygate.demo.policy import InferencePolicy

    path = folder / f"other-{input_name}-{obs_dim}.onnx"
    model = InferencePolicy(obs_dim=obs_dim).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.zeros(2, obs_dim),), str(path), dynamo=False,
                          input_names=[input_name], output_names=["logits"], opset_version=18,
                          dynamic_axes={input_name: {0: "batch"}, "logits": {0: "batch"}})
    return path


# --- tests ---------------------------------------------------------------------------------------


@pytest.fixture
def clean_sha(clean_demo: Path) -> str:
    return sha256(clean_demo / "policy.safetensors")


def test_missing_checkpoint(clean_demo: Path, tmp_path: Path, capsys) -> None:
    missing = tmp_path / "nowhere" / "policy.safetensors"
    cfg = write_config(tmp_path, clean_demo, {"policy": {"checkpoint": str(missing)}})
    code, out, err = run_in_process(capsys, cfg)
    assert_input_error(code, out, err, file=missing, key=None, cause="checkpoint not found")
    assert not missing.exists()


@pytest.mark.parametrize("make", [_truncated_safetensors, _truncated_pt],
                         ids=["safetensors", "torch"])
def test_truncated_checkpoint(clean_demo: Path, tmp_path: Path, capsys, make) -> None:
    ckpt = make(clean_demo, tmp_path)
    before = sha256(ckpt)
    cfg = write_config(tmp_path, clean_demo, {"policy": {"checkpoint": str(ckpt)}})
    code, out, err = run_in_process(capsys, cfg)
    assert_input_error(code, out, err, file=ckpt, key=None, cause="truncated or corrupt?")
    assert sha256(ckpt) == before


def test_pickle_checkpoint_is_refused_through_the_cli(clean_demo: Path, tmp_path: Path) -> None:
    ckpt, canary = _pickle_checkpoint(clean_demo, tmp_path)
    assert {"io.open", "builtins.open"} & _pickle_globals(ckpt), "the payload must be in the file"
    before = sha256(ckpt)
    cfg = write_config(tmp_path, clean_demo, {"policy": {"checkpoint": str(ckpt)}})
    code, out, err = run_subprocess(cfg, tmp_path)
    line = assert_input_error(code, out, err, file=ckpt, key=None, cause="refused")
    assert "allow_pickle: true" in line and PICKLE_REFUSED.split(";")[0] in line
    assert not canary.exists(), "loading the checkpoint ran code from it"
    assert sha256(ckpt) == before


def test_allow_pickle_is_the_only_way_to_unpickle(clean_demo: Path, tmp_path: Path,
                                                  monkeypatch) -> None:
    """Without the opt-in only ``weights_only=True`` is tried; with it, the full unpickler is
    requested (intercepted here, so the payload never runs)."""
    import torch

    from paritygate.checkpoints import load_state_dict
    from paritygate.errors import InputError

    ckpt, canary = _pickle_checkpoint(clean_demo, tmp_path)
    real_load = torch.load
    calls: list[bool] = []

    class Intercepted(BaseException):  # not an Exception: the loader's handlers let it through
        pass

    def guarded_load(*args: Any, weights_only: bool = True, **kwargs: Any) -> Any:
        calls.append(weights_only)
        if not weights_only:
            raise Intercepted
        return real_load(*args, weights_only=True, **kwargs)

    monkeypatch.setattr(torch, "load", guarded_load)
    with pytest.raises(InputError, match="refused"):
        load_state_dict(ckpt, allow_pickle=False)
    assert calls == [True]
    calls.clear()
    with pytest.raises(Intercepted):
        load_state_dict(ckpt, allow_pickle=True)
    assert calls == [True, False]
    assert not canary.exists()


def test_unknown_config_key(clean_demo: Path, tmp_path: Path, capsys, clean_sha) -> None:
    cfg = write_config(tmp_path, clean_demo, {"policy": {"checkpoint_path": "x.safetensors"}})
    code, out, err = run_in_process(capsys, cfg)
    assert_input_error(code, out, err, file=cfg, key="policy.checkpoint_path", cause="unknown key")
    assert sha256(clean_demo / "policy.safetensors") == clean_sha


def test_wrong_type(clean_demo: Path, tmp_path: Path, capsys, clean_sha) -> None:
    cfg = write_config(tmp_path, clean_demo, {"policy": {"probes": {"count": "many"}}})
    code, out, err = run_in_process(capsys, cfg)
    assert_input_error(code, out, err, file=cfg, key="policy.probes.count", cause="'many'")
    assert sha256(clean_demo / "policy.safetensors") == clean_sha


def test_factory_that_fails_to_import(clean_demo: Path, tmp_path: Path, capsys, clean_sha) -> None:
    cfg = write_config(tmp_path, clean_demo,
                       {"policy": {"inference_factory": "paritygate_no_such_module:build"}})
    code, out, err = run_in_process(capsys, cfg)
    assert_input_error(code, out, err, file=cfg, key="policy.inference_factory",
                       cause="cannot import 'paritygate_no_such_module'")
    assert sha256(clean_demo / "policy.safetensors") == clean_sha


def test_missing_probes_file(clean_demo: Path, tmp_path: Path, capsys, clean_sha) -> None:
    probes = tmp_path / "probes.npy"
    cfg = write_config(tmp_path, clean_demo, {"policy": {"probes": {"generator": None,
                                                                    "file": str(probes)}}})
    code, out, err = run_in_process(capsys, cfg)
    assert_input_error(code, out, err, file=probes, key="policy.probes.file",
                       cause="probe file not found")
    assert sha256(clean_demo / "policy.safetensors") == clean_sha


@pytest.mark.parametrize(("kwargs", "key", "cause"), [
    ({"input_name": "observation"}, "policy.artifact: inputs", "do not include 'obs'"),
    ({"obs_dim": 6}, "policy.artifact: inputs.obs", "axis 1 is 6 but the model input has 8"),
], ids=["input-name", "feature-width"])
def test_artifact_inputs_do_not_match(clean_demo: Path, tmp_path: Path, capsys, clean_sha,
                                      kwargs: dict[str, Any], key: str, cause: str) -> None:
    artifact = _export_legacy(tmp_path, **kwargs)
    before = sha256(artifact)
    cfg = write_config(tmp_path, clean_demo, {"policy": {"artifact": str(artifact)}})
    code, out, err = run_in_process(capsys, cfg)
    assert_input_error(code, out, err, file=artifact, key=key, cause=cause)
    assert sha256(artifact) == before
    assert sha256(clean_demo / "policy.safetensors") == clean_sha


def test_missing_checkpoint_through_the_cli(clean_demo: Path, tmp_path: Path) -> None:
    missing = tmp_path / "policy.safetensors"
    cfg = write_config(tmp_path, clean_demo, {"policy": {"checkpoint": str(missing)}})
    code, out, err = run_subprocess(cfg, tmp_path)
    assert_input_error(code, out, err, file=missing, key=None, cause="checkpoint not found")


def test_few_random_bytes_named_pt_are_bad_input(clean_demo: Path, tmp_path: Path,
                                                   capsys) -> None:
    ckpt = tmp_path / "junk.pt"
    ckpt.write_bytes(b"junk")  # too short for any torch header: struct.error inside torch.load
    cfg = write_config(tmp_path, clean_demo, {"policy": {"checkpoint": str(ckpt)}})
    code, out, err = run_in_process(capsys, cfg)
    assert_input_error(code, out, err, file=ckpt, key="policy.checkpoint",
                       cause="truncated or corrupt?")


def test_no_check_selected_exits_3_and_writes_a_report(clean_demo: Path, tmp_path: Path,
                                                        capsys) -> None:
    import json

    cfg = write_config(tmp_path, clean_demo, {"checks": []})
    capsys.readouterr()
    code = cli.main(["run", str(cfg), "--report-dir", str(tmp_path / "report")])
    out, err = capsys.readouterr()
    assert code == 3, f"exit {code}\nstdout: {out}\nstderr: {err}"
    assert "Traceback" not in out + err
    assert "nothing was verified" in err
    assert json.loads((tmp_path / "report" / "report.json").read_text())["status"] == (
        "nothing_verified")
    assert "NOTHING_VERIFIED" in (tmp_path / "report" / "report.md").read_text()
