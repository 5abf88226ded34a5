"""The README's and the docs' examples stay true: configs validate, error lines are real."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from paritygate.load import config_from_dict

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
RUNNING = DOCS / "running.md"  # the CLI page: exit codes and the bad-input lines
STUB_POLICY = {
    "training_factory": "m:f",
    "inference_factory": "m:g",
    "checkpoint": "c.safetensors",
    "probes": {"generator": "m:p"},
}
STUB_LM = {"model_dir": "model", "sampling": {"training": "training.yaml"}, "probes": "p.jsonl"}


def test_readme_yaml_examples_validate(tmp_path: Path) -> None:
    pages = [README, *sorted(DOCS.rglob("*.md"))]
    text = "\n".join(page.read_text(encoding="utf-8") for page in pages)
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    assert len(blocks) >= 4
    for block in blocks:
        data = yaml.safe_load(block)
        if "name" not in data and "causal_lm" in data:  # an LM fragment: a stub LM gate
            data = {"name": "readme", "family": "causal_lm", **data}
            data["causal_lm"] = {**STUB_LM, **data["causal_lm"]}
        elif "name" not in data:  # a fragment: complete it with a stub policy gate
            data = {"name": "readme", "family": "policy", **data}
            data.setdefault("policy", STUB_POLICY)
        config = config_from_dict(data, tmp_path / "gate.yaml")
        assert config.family in ("policy", "causal_lm", "hf_model")


def test_readme_starts_with_the_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    first_block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert first_block is not None
    commands = [ln for ln in first_block.group(1).splitlines() if ln and not ln.startswith("#")]
    assert "paritygate demo" in commands[0]
    assert "paritygate run configs/demo-policy.yaml" in commands[0]
    assert "pytest test_suites" in commands[1]
    ci = (README.parent / ".ci" / "run").read_text(encoding="utf-8")
    command = 'python -m pytest test_suites -q -n 2 -p no:cacheprovider -m "not vllm"'
    assert command in ci and command in commands[1]


def _run_cli(args: list[str], cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PARITYGATE_CONFIG", "CI")}
    proc = subprocess.run([sys.executable, "-m", "paritygate", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0].replace(f"{cwd.resolve()}/", "")


def test_readme_error_lines_match_real_output(tmp_path: Path) -> None:
    """Each example error line in the docs is what the command that provokes it prints."""
    import argparse

    import torch
    from safetensors.torch import save_file

    text = RUNNING.read_text(encoding="utf-8")
    block = re.search(r"one line naming the file and key, e\.g\.\n\n```\n(.*?)```", text, re.S)
    assert block is not None
    shown = block.group(1).strip().splitlines()

    (tmp_path / "configs").mkdir()
    (tmp_path / "ckpt").mkdir()
    demo = {
        "training_factory": "paritygate.demo.policy:build_training_model",
        "inference_factory": "paritygate.demo.policy:build_inference_model",
        "policy_output": "logits",
        "training_heads": ["value_head", "aux_head"],
        "probes": {"generator": "paritygate.demo.policy:probe_observations"},
    }

    def config(name: str, **policy: object) -> str:
        data = {"name": "readme", "family": "policy", "policy": {**demo, **policy}}
        (tmp_path / "configs" / name).write_text(yaml.safe_dump(data), encoding="utf-8")
        return f"configs/{name}"

    # A typo in a key; a pickle that needs arbitrary unpickling; a config from
    # `paritygate init` whose TODOs are not filled; an unknown --check id.
    typo = config("my.yaml", checkpoint="../ckpt/policy.pt", artifcat="../policy.onnx")
    torch.save({"w": torch.zeros(1), "args": argparse.Namespace(lr=3e-4)},
               tmp_path / "ckpt" / "policy.pt")
    pickled = config("pickled.yaml", checkpoint="../ckpt/policy.pt")
    save_file({"trunk.weight": torch.zeros(2, 2), "value_head.weight": torch.zeros(1, 2)},
              str(tmp_path / "ckpt" / "policy.safetensors"))
    init = subprocess.run(
        [sys.executable, "-m", "paritygate", "init", "ckpt/policy.safetensors", "--out",
         "configs/policy.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert init.returncode == 0, init.stdout + init.stderr
    real = [
        _run_cli(["run", typo], tmp_path),
        _run_cli(["run", pickled], tmp_path),
        _run_cli(["run", "configs/policy.yaml"], tmp_path),
        _run_cli(["run", pickled, "--check", "weight_load"], tmp_path),
    ]
    assert shown == real
