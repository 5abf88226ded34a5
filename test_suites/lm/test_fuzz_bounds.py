"""Inputs that exhaust a parser, memory or time: each is bad input (exit 2, one line naming
the file and key, no traceback) before any model loads, the child process's peak memory under
:data:`PEAK_MB`.

Each case runs ``python -m paritygate run`` in a child of a small wrapper that reports the
child's exit, output and peak RSS (``RUSAGE_CHILDREN``); two cases run at a time. There is no
wall-clock assertion, only a generous hang guard. Big inputs are built cheaply: nesting from a
few hundred KB, a zip member of zeros that deflates a thousandfold, a line just over
``MAX_LINE_BYTES``. That the refusal comes before a model loads is held by
:func:`test_refused_before_any_model_loads`: cases run in this process with the HF and
checkpoint loaders replaced by recorders.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from lm_zoo import clean_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fuzz_contract import Case, contract_breach, run_here

ARGS = {"run-all-202-checkpoints": ("--all",)}
PEAK_MB = 2048
HANG_GUARD_S = 300
DEEP = 200_000
WRAP = (
    "import json, resource, subprocess, sys, time\n"
    "t = time.perf_counter()\n"
    "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
    "print(json.dumps({'code': p.returncode, 'out': p.stdout[-3000:], 'err': p.stderr[-3000:],"
    " 'wall': time.perf_counter() - t,"
    " 'kb': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,"
    " 'cpu': resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime"
    " + resource.getrusage(resource.RUSAGE_CHILDREN).ru_stime}))\n"
)
Edit = Callable[[dict[str, Any], Path], tuple[str, str | None]]
"""Edits a clean config for one case in its folder; returns (file the line names, its key)."""


def _deep_json() -> str:
    return "[" * DEEP + "]" * DEEP


def _alias_bomb(levels: int = 9, width: int = 9) -> str:
    lines = [f"  l0: &l0 [{', '.join(['x'] * width)}]"]
    lines += [f"  l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * width)}]" for n in range(1, levels)]
    return "\n".join(lines) + "\n"


def _linked_model(src: Path, dst: Path) -> Path:
    """A model directory of links to the demo's files (nothing copied)."""
    dst.mkdir(parents=True)
    for f in src.iterdir():
        (dst / f.name).symlink_to(f)
    return dst


def _reward_fn(folder: Path, cfg: dict[str, Any]) -> None:
    (folder / "userfns.py").write_text(
        "def reward(prompts, completions, **kwargs):\n"
        "    return [float(len(c)) for c in completions]\n", encoding="utf-8")
    cfg["python_path"] = ["."]
    cfg["causal_lm"]["reward"] = {"function": "userfns:reward"}


def _good_dump_line() -> str:
    return json.dumps({"prompt_ids": [1, 5, 6], "completion_ids": [7, 2],
                       "finish_reason": "eos"})


def lm_cases(model: Path) -> dict[str, Edit]:
    """Case id -> edit of the clean LM config (in the case folder) returning (file, key)."""

    def reward_config_deep(cfg: dict[str, Any], f: Path) -> tuple[str, str | None]:
        rm = f / "rm"
        rm.mkdir()
        (rm / "config.json").write_text('{"architectures": ' + _deep_json() + "}")
        cfg["causal_lm"]["reward"] = {"model_dir": str(rm)}
        return "config.json", "causal_lm.reward.model_dir"

    def trainer_state_deep(cfg: dict[str, Any], f: Path) -> tuple[str, str | None]:
        ckpt = _linked_model(model, f / "out" / "checkpoint-1")
        (ckpt / "trainer_state.json").write_text('{"global_step": 1, "x": ' + _deep_json() + "}")
        cfg["causal_lm"]["model_dir"] = str(f / "out")
        return "trainer_state.json", "causal_lm.model_dir"

    def adapter_config_deep(cfg: dict[str, Any], f: Path) -> tuple[str, str | None]:
        ad = f / "adapter"
        ad.mkdir()
        (ad / "adapter_config.json").write_text('{"peft_type": ' + _deep_json() + "}")
        cfg["causal_lm"]["adapter"] = str(ad)
        return "adapter_config.json", "causal_lm.adapter"

    def completions(text: bytes, key: str) -> Callable[..., tuple[str, str | None]]:
        def build(cfg: dict[str, Any], f: Path) -> tuple[str, str | None]:
            _reward_fn(f, cfg)
            (f / "completions.jsonl").write_bytes(text)
            cfg["causal_lm"]["reward"]["completions"] = str(f / "completions.jsonl")
            return "completions.jsonl", key
        return build

    def trl(body: str) -> Callable[..., tuple[str, str | None]]:
        def build(cfg: dict[str, Any], f: Path) -> tuple[str, str | None]:
            (f / "trl.yaml").write_text("learning_rate: 1.0e-6\nnum_generations: 4\n"
                                        "max_completion_length: 16\n" + body)
            cfg["causal_lm"]["sampling"]["training"] = str(f / "trl.yaml")
            return "trl.yaml", "causal_lm.sampling.training"
        return build

    def behaviour_dump(bad: bytes) -> Callable[..., tuple[str, str | None]]:
        def build(cfg: dict[str, Any], f: Path) -> tuple[str, str | None]:
            good = (_good_dump_line() + "\n").encode()
            (f / "train.jsonl").write_bytes(good * 8)
            (f / "serve.jsonl").write_bytes(good * 7 + bad)
            cfg["causal_lm"]["behaviour"] = {"samples": 8, "training_dump": str(f / "train.jsonl"),
                                             "serving_dump": str(f / "serve.jsonl")}
            return "serve.jsonl", "causal_lm.behaviour.serving_dump"
        return build

    def run_all(cfg: dict[str, Any], f: Path) -> tuple[str, str | None]:
        for n in range(1, 202):  # one over MAX_ALL_CHECKPOINTS
            (f / "out" / f"checkpoint-{n}").mkdir(parents=True)
        _linked_model(model, f / "out" / "checkpoint-999")
        cfg["causal_lm"]["model_dir"] = str(f / "out")
        return "out", "--all"

    def config_value(name: str, value: str) -> Callable[..., tuple[str, str | None]]:
        def build(cfg: dict[str, Any], f: Path) -> tuple[str, str | None]:
            copy = f / "model"
            copy.mkdir()
            for src in model.iterdir():
                if src.name != "config.json":
                    (copy / src.name).symlink_to(src)
            data = json.loads((model / "config.json").read_text(encoding="utf-8"))
            data[name] = "@VALUE@"
            (copy / "config.json").write_text(
                json.dumps(data).replace('"@VALUE@"', value), encoding="utf-8")
            cfg["causal_lm"]["model_dir"] = str(copy)
            cfg["causal_lm"]["tokenizer"] = {"training": str(copy), "serving": str(copy)}
            return "config.json", name
        return build

    def samples(cfg: dict[str, Any], f: Path) -> tuple[str, str | None]:
        cfg["causal_lm"]["behaviour"] = {"samples": 10**12}
        return "gate.yaml", "causal_lm.behaviour.samples"

    def stop_list(cfg: dict[str, Any], f: Path) -> tuple[str, str | None]:
        values = yaml.safe_load(Path(cfg["causal_lm"]["sampling"]["serving"]).read_text())
        values["stop"] = [f"stop-{n}" for n in range(5000)]
        (f / "serving.yaml").write_text(yaml.safe_dump(values))
        cfg["causal_lm"]["sampling"]["serving"] = str(f / "serving.yaml")
        return "serving.yaml", "stop"

    oov = json.dumps({"prompt_ids": [1, 5], "completion_ids": [10**9], "finish_reason": "eos"})
    many = "".join(json.dumps({"prompt": "a", "completion": "b"}) + "\n" for _ in range(10**5))
    return {
        "reward-config-json-200k-deep": reward_config_deep,
        "trainer-state-200k-deep": trainer_state_deep,
        "adapter-config-200k-deep": adapter_config_deep,
        "completions-line-200k-deep": completions(
            (json.dumps({"prompt": "a", "completion": "b"}) + "\n" + _deep_json() + "\n").encode(),
            "causal_lm.reward.completions: line 2"),
        "completions-random-bytes": completions(bytes(range(256)) * 64,
                                                "causal_lm.reward.completions"),
        "completions-10^5": completions(many.encode(), "causal_lm.reward.completions"),
        "trl-yaml-100k-deep": trl("generation_kwargs: " + "[" * 10**5 + "]" * 10**5 + "\n"),
        "trl-yaml-alias-bomb": trl("x-anchors:\n" + _alias_bomb()
                                   + "generation_kwargs: {bomb: *l8}\n"),
        "behaviour-samples-10^12": samples,
        "run-all-202-checkpoints": run_all,
        "behaviour-dump-token-10^9": behaviour_dump(oov.encode() + b"\n"),
        "behaviour-dump-binary-line": behaviour_dump(bytes(range(128, 256)) + b"\n"),
        "behaviour-dump-deep-line": behaviour_dump(_deep_json().encode() + b"\n"),
        "stop-list-5000": stop_list,
        "config-json-hidden-size-nan": config_value("hidden_size", "NaN"),
        "config-json-vocab-10^12": config_value("vocab_size", str(10**12)),
    }


def policy_cases(clean: Path) -> dict[str, Edit]:
    """Case id -> edit of the clean demo policy config returning (file, key)."""

    def artifact(name: str, fmt: str, data: Callable[[], bytes]) -> Callable[..., Any]:
        def build(cfg: dict[str, Any], f: Path) -> tuple[str, str | None]:
            (f / name).write_bytes(data())
            cfg["policy"]["artifact"] = str(f / name)
            cfg["policy"]["artifact_format"] = fmt
            cfg["allow_pickle"] = True
            return name, "policy.artifact"
        return build

    def bomb(name: str, fmt: str) -> Callable[..., Any]:
        def build(cfg: dict[str, Any], f: Path) -> tuple[str, str | None]:
            with zipfile.ZipFile(f / name, "w", zipfile.ZIP_DEFLATED) as zf:
                zf.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
                with zf.open("archive/data/0", "w", force_zip64=True) as member:
                    chunk = bytes(2**24)
                    for _ in range(8):  # 128 MiB of zeros: ~130 KB deflated
                        member.write(chunk)
            cfg["policy"]["artifact"] = str(f / name)
            cfg["policy"]["artifact_format"] = fmt
            cfg["allow_pickle"] = True
            return name, "policy.artifact"
        return build

    def log(text: bytes, key: str | None = "policy.serving_log") -> Callable[..., Any]:
        def build(cfg: dict[str, Any], f: Path) -> tuple[str, str | None]:
            (f / "log.jsonl").write_bytes(text)
            cfg["policy"]["serving_log"] = {"path": str(f / "log.jsonl")}
            return "log.jsonl", key
        return build

    good = (json.dumps({"obs": [0.0] * 8, "served": [0.0] * 4}) + "\n").encode()
    exported = (clean / "policy.onnx").read_bytes()
    return {
        "pt2-truncated": artifact("policy.pt2", "torch_export", lambda: exported[:300]),
        "pt2-random-bytes": artifact("policy.pt2", "torch_export", lambda: os.urandom(4096)),
        "torchscript-zip-bomb": bomb("policy.pt", "torchscript"),
        "pt2-zip-bomb": bomb("policy.pt2", "torch_export"),
        "serving-log-binary-line": log(good + bytes(range(128, 256)) + b"\n"),
        "serving-log-200k-deep-line": log(good + _deep_json().encode() + b"\n"),
        "serving-log-17MiB-line": log(good + b'{"obs": "' + b"x" * (17 * 2**20) + b'"}\n'),
        "serving-log-bad-last-of-10^5": log(good * 10**5 + b'{"obs": [1]}\n'),
    }


def _policy_config(clean: Path) -> dict[str, Any]:
    root = Path(__file__).resolve().parents[2]
    data = yaml.safe_load((root / "configs" / "demo-policy.yaml").read_text(encoding="utf-8"))
    data["policy"]["checkpoint"] = str(clean / "policy.safetensors")
    data["policy"]["artifact"] = str(clean / "policy.onnx")
    data["policy"]["preprocessing"]["stats"] = str(clean / "obs_norm.json")
    return data


def build_cases(demo_lm: Path, demo_policy: Path, root: Path) -> list[Case]:
    cases = []
    for family, edits in (("lm", lm_cases(demo_lm)), ("policy", policy_cases(demo_policy))):
        for cid, edit in edits.items():
            folder = root / cid
            folder.mkdir(parents=True)
            cfg = clean_config(demo_lm) if family == "lm" else _policy_config(demo_policy)
            cfg["golden"] = {"dir": str(folder / "golden")}
            file, key = edit(cfg, folder)
            config = folder / "gate.yaml"
            config.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
            cases.append(Case(cid, config, file, key, ARGS.get(cid, ())))
    return cases


def run_measured(case: Case) -> dict[str, Any]:
    """``paritygate run`` on ``case`` in a child; its exit, output and peak RSS in KiB."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("GITHUB_STEP_SUMMARY", "PARITYGATE_CONFIG")}
    proc = subprocess.run(
        [sys.executable, "-c", WRAP, sys.executable, "-m", "paritygate", "run",
         str(case.config), *case.args],
        cwd=case.config.parent, capture_output=True, text=True, timeout=HANG_GUARD_S, env=env)
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def test_exhausting_inputs_are_bad_input_in_bounded_memory(
        demo_lm: Path, demo_policy: Path, tmp_path: Path) -> None:
    cases = build_cases(demo_lm, demo_policy, tmp_path)
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(run_measured, cases))
    broken = {}
    for case, res in zip(cases, results, strict=True):
        problem = contract_breach(case, res["code"], res["out"], res["err"])
        if problem is None and res["kb"] > PEAK_MB * 1024:
            problem = f"peak RSS {res['kb'] // 1024} MB"
        if problem:
            broken[case.id] = problem
    assert not broken, "\n".join(f"{k}: {v}" for k, v in broken.items())


PRE_LOAD = ("completions-random-bytes", "behaviour-dump-token-10^9", "trl-yaml-alias-bomb",
            "reward-config-json-200k-deep", "serving-log-bad-last-of-10^5",
            "config-json-hidden-size-nan", "config-json-vocab-10^12")


def test_refused_before_any_model_loads(demo_lm: Path, demo_policy: Path, tmp_path: Path,
                                        capfd: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The refusal of a bad input does not wait for a model: with the HF loader and the
    policy checkpoint loader replaced by recorders, each case ends in exit 2 and neither was
    called (whatever the model's size, the refusal costs the scan of the inputs only)."""
    import transformers.modeling_utils as hf

    import paritygate.checkpoints as checkpoints

    loaded: list[str] = []

    def record(name: str) -> Callable[..., Any]:
        def loader(*args: Any, **kwargs: Any) -> Any:
            loaded.append(name)
            raise AssertionError(f"{name} called before the bad input was refused")
        return loader

    monkeypatch.setattr(hf.PreTrainedModel, "from_pretrained", classmethod(record("hf")))
    monkeypatch.setattr(checkpoints, "load_checkpoint_state", record("policy checkpoint"))
    wanted = [c for c in build_cases(demo_lm, demo_policy, tmp_path) if c.id in PRE_LOAD]
    assert len(wanted) == len(PRE_LOAD)
    outcomes = {c.id: contract_breach(c, *run_here(c, capfd)) for c in wanted}
    assert not loaded, loaded
    assert not any(outcomes.values()), outcomes
