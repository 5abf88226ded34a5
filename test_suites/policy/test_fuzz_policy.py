"""Bad inputs of the policy family beyond the config: checkpoints, artifacts, probes,
factories, golden files and report dirs, each through the CLI (``fuzz_contract``).

Every case writes its faulty inputs into its own folder beside a config pointing at them;
the clean demo is built once per session and only read.
"""

from __future__ import annotations

import io
import json
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from policy_zoo import base_config, merge

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fuzz_contract import CANARY, Canary, Case, run_cases

NAME = "demo-policy"
Builder = Callable[[Path, Path], tuple[dict[str, Any], str, str | None]]
"""(clean demo, case folder) -> (config overrides, file the line names, key it names)."""


def _config(clean: Path, folder: Path, overrides: dict[str, Any]) -> Path:
    data = merge(base_config(clean), {"golden": {"dir": str(folder / "golden")}})
    data = merge(data, overrides)
    path = folder / "gate.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def _state(clean: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return dict(load_file(str(clean / "policy.safetensors")))


def _ckpt(folder: Path, name: str, data: bytes) -> tuple[dict[str, Any], str, str]:
    path = folder / name
    path.write_bytes(data)
    return {"policy": {"checkpoint": str(path)}}, name, "policy.checkpoint"


def _pickled(clean: Path, folder: Path) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save({**_state(clean), "_extra": Canary(folder / CANARY)}, buf)
    return buf.getvalue()


def _npy(folder: Path, arr: Any, **kw: Any) -> tuple[dict[str, Any], str, str]:
    path = folder / "probes.npy"
    np.save(path, arr, **kw)
    return {"policy": {"probes": {"generator": None, "file": str(path)}}}, "probes.npy", (
        "policy.probes.file")


def _module(folder: Path, source: str) -> dict[str, Any]:
    (folder / "userfns.py").write_text(source, encoding="utf-8")
    return {"python_path": ["."]}


def _legacy_onnx(folder: Path, *, input_name: str = "obs", obs_dim: int = 8) -> Path:
    import warnings

    import torch

    from paritygate.demo.policy import InferencePolicy

    path = folder / "other.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(InferencePolicy(obs_dim=obs_dim).eval(), (torch.zeros(2, obs_dim),),
                          str(path), dynamo=False, input_names=[input_name],
                          output_names=["logits"], opset_version=18,
                          dynamic_axes={input_name: {0: "batch"}, "logits": {0: "batch"}})
    return path


def _artifact_copy(clean: Path, folder: Path, manifest: bytes | None,
                   onnx: bytes | None = None) -> dict[str, Any]:
    art = folder / "policy.onnx"
    art.write_bytes(onnx if onnx is not None else (clean / "policy.onnx").read_bytes())
    if manifest is not None:
        (folder / "manifest.json").write_bytes(manifest)
    return {"policy": {"artifact": str(art)}}


def _golden(folder: Path, text: str) -> dict[str, Any]:
    gdir = folder / "golden" / NAME
    gdir.mkdir(parents=True)
    (gdir / "weights_load.json").write_text(text, encoding="utf-8")
    return {}


CASES: dict[str, Builder] = {
    # --- checkpoints ---
    "ckpt-truncated-safetensors": lambda c, f: _ckpt(
        f, "t.safetensors", (c / "policy.safetensors").read_bytes()[:3000]),
    "ckpt-random-safetensors": lambda c, f: _ckpt(f, "r.safetensors", np.random.default_rng(
        1).bytes(4096)),
    "ckpt-empty-safetensors": lambda c, f: _ckpt(f, "e.safetensors", b""),
    "ckpt-random-pt": lambda c, f: _ckpt(f, "r.pt", np.random.default_rng(2).bytes(4096)),
    "ckpt-zip-header-pt": lambda c, f: _ckpt(f, "z.pt", b"PK\x03\x04" + bytes(200)),
    "ckpt-pickle-pt-canary": lambda c, f: _ckpt(f, "evil.pt", _pickled(c, f)),
    "ckpt-pickle-pth-canary": lambda c, f: _ckpt(f, "evil.pth", _pickled(c, f)),
    "ckpt-sb3-zip-pickle": lambda c, f: _sb3_zip(c, f),
    "ckpt-not-a-state-dict": lambda c, f: _ckpt(f, "list.pt", _torch_bytes([1, 2, 3])),
    "ckpt-training-no-state-dict": lambda c, f: (*_ckpt(f, "train.pt", _torch_bytes(
        {"agent": {"actor": _state(c), "critic": {"w": _state(c)["trunk.0.bias"]}},
         "optimizer": {"state": {}, "param_groups": []}, "step": 3}))[:2],
        "policy.state_dict_key"),
    "ckpt-state-dict-key-absent": lambda c, f: _keyed(f, "agent.actor", {"model": _state(c)}),
    "ckpt-state-dict-key-not-mapping": lambda c, f: _keyed(f, "step", {"model": _state(c),
                                                                        "step": 3}),
    "ckpt-state-dict-key-not-tensors": lambda c, f: _keyed(f, "optimizer", {
        "model": _state(c), "optimizer": {"lr": 0.1}}),
    "distribution-log-std-absent": lambda c, f: ({"policy": {
        "action_space": "continuous", "distribution": {"log_std_key": "log_std"}}},
        "gate.yaml", "policy.distribution.log_std_key"),
    "distribution-log-std-output-absent": lambda c, f: ({"policy": {
        "action_space": "continuous", "distribution": {"log_std": "output",
                                                       "log_std_key": "log_std"}}},
        "gate.yaml", "policy.distribution.log_std_key"),
    "distribution-scale-width": lambda c, f: ({"policy": {
        "action_space": "continuous", "distribution": {"log_std_key": "policy_head.bias",
                                                       "action_scale": [1.0, 2.0, 3.0]}}},
        "gate.yaml", "policy.distribution.action_scale"),
    "distribution-clamp-unordered": lambda c, f: ({"policy": {
        "action_space": "continuous", "distribution": {"log_std_clamp": [2.0, -5.0]}}},
        "gate.yaml", "policy.distribution.log_std_clamp"),
    "ckpt-directory": lambda c, f: ({"policy": {"checkpoint": str(_mkdir(f / "d.pt"))}},
                                    "d.pt", "policy.checkpoint"),
    # --- artifacts ---
    "onnx-random-bytes": lambda c, f: (_artifact_copy(c, f, None, np.random.default_rng(
        3).bytes(2048)), "policy.onnx", "policy.artifact"),
    "onnx-truncated": lambda c, f: (_artifact_copy(c, f, None, (c / "policy.onnx").read_bytes()[
        :500]), "policy.onnx", "policy.artifact"),
    "onnx-missing": lambda c, f: ({"policy": {"artifact": str(f / "nope.onnx")}}, "nope.onnx",
                                  "policy.artifact"),
    "onnx-wrong-input-name": lambda c, f: ({"policy": {"artifact": str(_legacy_onnx(
        f, input_name="observation"))}}, "other.onnx", "policy.artifact: inputs"),
    "onnx-wrong-width": lambda c, f: ({"policy": {"artifact": str(_legacy_onnx(
        f, obs_dim=6))}}, "other.onnx", "policy.artifact: inputs.obs"),
    "manifest-corrupt-json": lambda c, f: (_artifact_copy(c, f, b"{not json"), "manifest.json",
                                           "policy.manifest"),
    "manifest-not-mapping": lambda c, f: (_artifact_copy(c, f, b"[1, 2]"), "manifest.json",
                                          "policy.manifest"),
    "manifest-not-utf8": lambda c, f: (_artifact_copy(c, f, b"\xff\xfe{}"), "manifest.json",
                                       "policy.manifest"),
    # --- probes ---
    "probes-missing": lambda c, f: ({"policy": {"probes": {"generator": None, "file": str(
        f / "none.npy")}}}, "none.npy", "policy.probes.file"),
    "probes-wrong-width": lambda c, f: _npy(f, np.zeros((16, 6), np.float32)),
    "probes-wrong-dtype": lambda c, f: _npy(f, np.array([["a"] * 8] * 4)),
    "probes-all-nan": lambda c, f: _npy(f, np.full((16, 8), np.nan, np.float32)),
    "probes-1d": lambda c, f: _npy(f, np.zeros(8, np.float32)),
    "probes-random-bytes": lambda c, f: ({"policy": {"probes": {"generator": None, "file": str(
        _write(f / "probes.npy", b"\x93NUMPY garbage"))}}}, "probes.npy", "policy.probes.file"),
    "probes-object-pickle-canary": lambda c, f: _npy(
        f, np.array([Canary(f / CANARY)] * 8, dtype=object), allow_pickle=True),
    "probes-generator-raises": lambda c, f: (merge(_module(f, "def gen(n, s):\n    raise "
        "RuntimeError('boom')\n"), {"policy": {"probes": {"generator": "userfns:gen"}}}),
        "gate.yaml", "policy.probes.generator"),
    # --- factories and preprocessing ---
    "factory-unimportable": lambda c, f: ({"policy": {"training_factory": "no_such_mod:build"}},
                                          "gate.yaml", "policy.training_factory"),
    "factory-not-callable": lambda c, f: ({"policy": {
        "inference_factory": "paritygate.demo.policy:OBS_DIM"}}, "gate.yaml",
        "policy.inference_factory"),
    "factory-raises": lambda c, f: (merge(_module(f, "def build(**kw):\n    raise ValueError("
        "'no')\n"), {"policy": {"training_factory": "userfns:build"}}), "gate.yaml",
        "policy.training_factory"),
    "factory-returns-int": lambda c, f: (merge(_module(f, "def build(**kw):\n    return 3\n"),
        {"policy": {"inference_factory": "userfns:build"}}), "gate.yaml",
        "policy.inference_factory"),
    "factory-module-syntax-error": lambda c, f: (merge(_module(f, "def build(:\n"), {"policy": {
        "training_factory": "userfns:build"}}), "gate.yaml", "policy.training_factory"),
    "preprocessing-raises": lambda c, f: (merge(_module(f, "def pre(raw, **kw):\n    raise "
        "KeyError('mean')\n"), {"policy": {"preprocessing": {"training": "userfns:pre"}}}),
        "gate.yaml", "policy.preprocessing.training"),
    "stats-corrupt-json": lambda c, f: ({"policy": {"preprocessing": {"stats": str(_write(
        f / "stats.json", b"{oops"))}}}, "stats.json", "policy.preprocessing.stats"),
    "stats-directory": lambda c, f: ({"policy": {"preprocessing": {"stats": str(_mkdir(
        f / "stats"))}}}, "stats", "policy.preprocessing.stats"),
    # --- golden and report dirs ---
    "golden-corrupt-json": lambda c, f: (_golden(f, "{\"metrics\": {"), "weights_load.json",
                                         "line 1"),
    "golden-not-mapping": lambda c, f: (_golden(f, "[1, 2, 3]"), "weights_load.json", "metrics"),
    "golden-metric-not-number": lambda c, f: (_golden(f, '{"metrics": {"missing_keys": "abc"}}'),
                                              "weights_load.json", "metrics.missing_keys"),
    "golden-dir-is-file": lambda c, f: ({"golden": {"dir": str(_write(f / "g", b"x"))}}, "g",
                                        "golden.dir"),
    "report-dir-is-file": lambda c, f: ({"report_dir": str(_write(f / "r", b"x"))}, "r",
                                        "report_dir"),
    "report-dir-under-file": lambda c, f: ({"report_dir": str(_write(f / "r", b"x") / "sub")},
                                           "r", "report_dir"),
}
ARGS: dict[str, tuple[str, ...]] = {
    "golden-corrupt-json": ("--check", "weights_load"),
    "golden-not-mapping": ("--check", "weights_load"),
    "golden-metric-not-number": ("--check", "weights_load"),
}
PARALLEL = ("ckpt-truncated-safetensors", "golden-corrupt-json", "probes-wrong-width")
"""Cases also run with ``-n 2`` (pytest-xdist workers report the same one line)."""


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


def _torch_bytes(obj: Any) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _keyed(folder: Path, key: str, checkpoint: dict[str, Any]
           ) -> tuple[dict[str, Any], str, str]:
    """A training checkpoint and a ``policy.state_dict_key`` that does not pick a state dict."""
    overrides, name, _ = _ckpt(folder, "train.pt", _torch_bytes(checkpoint))
    overrides["policy"]["state_dict_key"] = key
    return overrides, name, "policy.state_dict_key" if key != "optimizer" else "optimizer.lr"


def _sb3_zip(clean: Path, folder: Path) -> tuple[dict[str, Any], str, str]:
    path = folder / "ppo.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("data", json.dumps({"policy_class": "x"}))
        zf.writestr("policy.pth", _pickled(clean, folder))
    return {"policy": {"checkpoint": str(path)}}, "ppo.zip", "policy.checkpoint"


def _cases(clean: Path, root: Path) -> list[Case]:
    out = []
    runs = [(cid, ()) for cid in CASES] + [(cid, ("-n", "2")) for cid in PARALLEL]
    for cid, extra in runs:
        folder = root / (cid + ("-n2" if extra else ""))
        folder.mkdir(parents=True)
        overrides, file, key = CASES[cid](clean, folder)
        config = _config(clean, folder, overrides)
        out.append(Case(cid + ("-n2" if extra else ""), config, file, key,
                        (*ARGS.get(cid, ()), *extra)))
    return out


def test_policy_bad_inputs_keep_the_contract(clean_demo: Path, tmp_path: Path,
                                            capfd: pytest.CaptureFixture[str]) -> None:
    cases = _cases(clean_demo, tmp_path)
    assert len(cases) >= 30
    broken = run_cases(cases, [clean_demo], capfd)
    assert not broken, "\n".join(f"{k}: {v}" for k, v in broken.items())


@pytest.mark.parametrize("cid", ["ckpt-pickle-pt-canary", "ckpt-sb3-zip-pickle",
                                 "probes-object-pickle-canary"])
def test_canary_payloads_are_live(clean_demo: Path, tmp_path: Path, cid: str) -> None:
    """The pickled payloads would create the canary if anything unpickled them."""
    import torch

    overrides, _, _ = CASES[cid](clean_demo, tmp_path)
    policy = overrides["policy"]
    path = Path(policy.get("checkpoint") or policy["probes"]["file"])
    if path.suffix == ".npy":
        np.load(path, allow_pickle=True)
    else:
        data = zipfile.ZipFile(path).read("policy.pth") if path.suffix == ".zip" else (
            path.read_bytes())
        torch.load(io.BytesIO(data), weights_only=False)
    assert (tmp_path / CANARY).exists()
