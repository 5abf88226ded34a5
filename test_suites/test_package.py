"""The package is self-contained: the wheel ships the gate suite and the demo's configs and
golden; ``paritygate demo``, ``paritygate init`` and ``pytest --pyargs paritygate_gates`` work
from a folder outside the repository; the CLI conventions hold."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.xdist_group("package")


def run(args: list[str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    """A command as a new user runs it in CI: outside the repository, CI=true, no TTY."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("GITHUB_STEP_SUMMARY", "PARITYGATE_CONFIG", "PYTHONPATH")}
    env["CI"] = "true"
    assert REPO not in [cwd, *cwd.parents]
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def paritygate(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run([sys.executable, "-m", "paritygate", *args], cwd)


def fill_todos(config: Path, values: dict[str, str]) -> None:
    """Replace each ``key: "TODO: ..."`` line's value, as a user editing the file would."""
    text = config.read_text(encoding="utf-8")
    for key, value in values.items():
        text, n = re.subn(rf'({key}: )"TODO(?:[^"\\]|\\.)*"', rf"\g<1>{value}", text, count=1)
        assert n == 1, f"no TODO for {key} in {config}"
    assert '"TODO' not in text
    config.write_text(text, encoding="utf-8")


@pytest.fixture(scope="module")
def demo_out(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """``paritygate demo --only policy`` run from a fresh folder outside the repository."""
    root = tmp_path_factory.mktemp("new-user")
    (root / "elsewhere").mkdir()
    proc = paritygate("demo", "--only", "policy", "--out", str(root / "demo"),
                      cwd=root / "elsewhere")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return root / "demo", proc


def test_wheel_ships_gate_suite_and_demo_bundle(tmp_path: Path) -> None:
    proc = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                "-w", str(tmp_path), str(REPO)], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = tmp_path.glob("paritygate-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in (
        "paritygate_gates/test_weights_load.py",
        "paritygate_gates/test_generation_parity.py",
        "paritygate/demo/configs/demo-policy.yaml",
        "paritygate/demo/configs/demo-lm.yaml",
        "paritygate/demo/configs/sampling/demo-lm-train.yaml",
        "paritygate/demo/configs/sampling/demo-lm-vllm.yaml",
        "paritygate/demo/golden/demo-policy/logits_agreement.json",
        "paritygate/demo/golden/demo-lm/probes.jsonl",
        "paritygate/demo/golden/demo-lm/logprob_delta.json",
        "paritygate/demo/configs/demo-rl-loop.yaml",
        "paritygate/demo/golden/demo-rl-loop/reward_parity.json",
        "paritygate/demo/rl_loop.py",
        "paritygate/demo/configs/demo-rollout.yaml",
        "paritygate/demo/golden/demo-rollout/rollout_parity.json",
        "paritygate/demo/rollout.py",
        "paritygate/demo/data/corpus.txt",
        "paritygate/init.py",
        "paritygate/progress.py",
    ):
        assert name in names, f"{name} missing from {wheel.name}"
    assert not [n for n in names if n.endswith(".obtained.json")]
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    points = zipfile.ZipFile(wheel).read(entry).decode()
    assert "paritygate = paritygate.plugin" in points and "paritygate.cli:main" in points
    # The license ships (PEP 639) and matches the repository's file.
    (license_file,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
    text = zipfile.ZipFile(wheel).read(license_file).decode()
    assert text == (REPO / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    metadata = zipfile.ZipFile(wheel).read(
        next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in metadata and "License-File: LICENSE" in metadata
    # It installs from the registry alone: every requirement is a name and a range (no URL,
    # no path), and the README's install line needs no file from a clone.
    requires = re.findall(r"^Requires-Dist: (.+)$", metadata, re.M)
    assert requires and not [r for r in requires if "@" in r or "/" in r.split(";")[0]]
    readme = (REPO / "docs" / "install.md").read_text(encoding="utf-8")
    section = readme[readme.index("# Installed from the wheel"):]
    install = next(line for line in section.splitlines() if line.startswith("pip install "))
    assert " -c " not in install and "constraints" not in install, install


def test_demo_writes_configs_and_golden_and_prints_a_working_command(
    demo_out: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    out, proc = demo_out
    assert (out / "configs" / "demo-policy.yaml").is_file()
    assert (out / "golden" / "demo-policy" / "logits_agreement.json").is_file()
    text = proc.stdout + proc.stderr
    assert "\x1b" not in text and "\r" not in text, "progress escape codes in CI output"
    assert "demo policy: training: 150/300 (50%)" in text
    assert re.search(r"demo policy: exporting ONNX: done in \d+\.\ds", text)
    match = re.search(r"Next: (paritygate run \S+)", proc.stdout)
    assert match is not None, proc.stdout
    args = match.group(1).split()[1:]
    gated = paritygate(*args, cwd=tmp_path)
    assert gated.returncode == 0, gated.stdout + gated.stderr
    assert "status: pass" in gated.stdout


def test_pytest_pyargs_runs_the_shipped_gate_suite_outside_the_repo(
    demo_out: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    out, _ = demo_out
    config = out / "configs" / "demo-policy.yaml"
    base = [sys.executable, "-m", "pytest", "--pyargs", "paritygate_gates", "-p",
            "no:cacheprovider", "--report-dir", str(tmp_path / "report")]
    proc = run([*base, "--gate-config", str(config), "-m", "fast"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "9 passed" in proc.stdout and (tmp_path / "report" / "report.json").is_file()

    # A failing check: its cause is printed once, FAILED stays in the short summary.
    data = yaml.safe_load(config.read_text(encoding="utf-8"))
    data["thresholds"] = {"logits_agreement": {"max_abs_diff": 1.0e-12}}
    strict = out / "configs" / "strict.yaml"
    strict.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    proc = run([*base, "--gate-config", str(strict), "-k", "logits_agreement"], tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert re.search(r"^FAILED \S*test_logits_agreement\.py::test_logits_agreement\b",
                     proc.stdout, re.M), proc.stdout
    cause = re.search(r"^logits_agreement: (max_abs_diff .+)$", proc.stdout, re.M)
    assert cause is not None, proc.stdout
    assert proc.stdout.count(cause.group(1)) == 1, proc.stdout


def test_init_on_the_demo_policy_fill_bless_run(
    demo_out: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    out, _ = demo_out
    proc = paritygate("init", str(out / "policy" / "policy.safetensors"), "--out",
                      "configs/policy.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    config = tmp_path / "configs" / "policy.yaml"
    data = yaml.safe_load(config.read_text(encoding="utf-8"))
    policy = data["policy"]
    assert policy["training_heads"] == ["aux_head", "value_head"]
    assert policy["input_name"] == "obs" and policy["output_names"] == ["logits"]
    assert policy["artifact"].endswith("policy/policy.onnx")
    assert data["python_path"] == [".."]  # the folder init ran in, relative to the config
    # A half-edited config never runs: exit 2 naming the first TODO key.
    refused = paritygate("run", "configs/policy.yaml", cwd=tmp_path)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "paritygate: error: configs/policy.yaml: policy.training_factory: still TODO: replace "
        "the placeholder (and 3 more: policy.inference_factory, policy.policy_output, "
        "policy.probes.generator)"
    ]
    fill_todos(config, {
        "training_factory": "paritygate.demo.policy:build_training_model",
        "inference_factory": "paritygate.demo.policy:build_inference_model",
        "policy_output": "logits",
        "generator": "paritygate.demo.policy:probe_observations",
    })
    bless = paritygate("run", "configs/policy.yaml", "--update-golden", cwd=tmp_path)
    assert bless.returncode == 0, bless.stdout + bless.stderr
    assert (tmp_path / "golden" / "policy" / "logits_agreement.json").is_file()
    gated = paritygate("run", "configs/policy.yaml", cwd=tmp_path)
    assert gated.returncode == 0, gated.stdout + gated.stderr


def test_init_config_imports_the_users_own_package(
    demo_out: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    """A package in the folder init ran in imports without PYTHONPATH or installing it."""
    out, _ = demo_out
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("", encoding="utf-8")
    (tmp_path / "mypkg" / "models.py").write_text(
        "from paritygate.demo.policy import build_training_model as build\n", encoding="utf-8")
    proc = paritygate("init", str(out / "policy" / "policy.safetensors"), "--out",
                      "configs/policy.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    fill_todos(tmp_path / "configs" / "policy.yaml", {
        "training_factory": "mypkg.models:build",
        "inference_factory": "paritygate.demo.policy:build_inference_model",
        "policy_output": "logits",
        "generator": "paritygate.demo.policy:probe_observations",
    })
    check = ("from paritygate.load import load_config\n"
             "from paritygate.imports import import_callable\n"
             "c = load_config('policy.yaml')\n"
             "print(import_callable('mypkg.models:build', c.path, 'k').__name__)\n"
             "import_callable('notmypkg.models:build', c.path, 'k')\n")
    # run from configs/: the package's folder is not on sys.path unless python_path adds it
    proc = run([sys.executable, "-c", check], tmp_path / "configs")
    assert proc.stdout.strip() == "build_training_model", proc.stdout + proc.stderr
    assert ("No module named 'notmypkg' (install it, or add the folder that holds it to "
            "python_path, relative to the config)") in proc.stderr


def test_readme_python_api_example_runs(
    demo_out: tuple[Path, subprocess.CompletedProcess[str]]
) -> None:
    out, _ = demo_out
    readme = (REPO / "docs" / "api.md").read_text(encoding="utf-8")
    section = readme[readme.index("# Python API"):]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    assert "demo/configs/demo-policy.yaml" in code.group(1)
    proc = run([sys.executable, "-c", code.group(1)], out.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"^pass \S*reports/api-demo \[", proc.stdout, re.M), proc.stdout
    assert (out.parent / "reports" / "api-demo" / "report.json").is_file()


def test_init_on_an_sb3_zip_fill_bless_run(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("stable_baselines3", reason="stable-baselines3 not installed (extra 'sb3')")
    from stable_baselines3 import PPO

    from paritygate import Gate, write_config

    model = PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, n_epochs=1, seed=0,
                device="cpu")
    model.learn(64)
    model.save(tmp_path / "ppo_cartpole.zip")
    monkeypatch.chdir(tmp_path)  # golden/ is proposed beside the working folder
    rng = np.random.default_rng(0)
    np.save(tmp_path / "probes.npy",
            rng.normal(0, [1.0, 0.5, 0.1, 0.5], size=(32, 4)).astype(np.float32))
    written = write_config(tmp_path / "ppo_cartpole.zip", out=tmp_path / "configs" / "ppo.yaml")
    assert written.todos == ["policy.probes.generator"]
    data = yaml.safe_load(written.path.read_text(encoding="utf-8"))
    assert data["policy"]["factory_kwargs"] == {"obs_dim": 4, "n_actions": 2, "net_arch": [64, 64]}
    assert data["policy"]["training_heads"] == ["mlp_extractor.value_net", "value_net"]
    text = written.path.read_text(encoding="utf-8")
    text = re.sub(r'generator: "TODO[^"]*"', "file: ../probes.npy", text)
    # The checks test_sb3.py proves on SB3 zips (precision_per_layer is gated there separately).
    text += ("checks: [weights_load, batchnorm_export, head_removal, dropout_off, "
             "logits_agreement, export_integrity]\n")
    written.path.write_text(text, encoding="utf-8")
    for bless in (True, False):
        gate = Gate.from_path(written.path, update_golden=bless)
        results = gate.run()
        assert results and all(r.status in ("pass", "skip") for r in results), [
            (r.id, r.status, r.message) for r in results]
    assert (gate.golden.directory / "logits_agreement.json").is_file()
    assert gate.golden.directory.parent == tmp_path / "golden"


def test_cli_version_checks_and_check_selection(tmp_path: Path) -> None:
    from paritygate import CHECK_IDS, __version__
    from paritygate.checks import get_check

    version = paritygate("--version", cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.strip() == f"paritygate {__version__}"
    listed = paritygate("checks", cwd=tmp_path)
    assert listed.returncode == 0
    lines = listed.stdout.strip().splitlines()
    assert [ln.split()[0] for ln in lines] == list(CHECK_IDS)
    for line in lines:
        cid, families, marks = line.split()[:3]
        spec = get_check(cid)
        assert families == ",".join(spec.families) and marks == ",".join(spec.marks)
    policy_only = paritygate("checks", "--family", "policy", cwd=tmp_path).stdout.split("\n")
    assert not any(ln.startswith("tokenizer_parity") for ln in policy_only)


def test_every_cli_argument_has_help() -> None:
    from paritygate.cli import _parser

    def actions(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.Action]]:
        found = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    found += [(f"{name} {a}", act) for a, act in actions(sub)]
            elif not isinstance(action, argparse._HelpAction):
                found.append((action.dest, action))
        return found

    missing = [name for name, action in actions(_parser()) if not action.help]
    assert not missing, f"arguments without help: {missing}"


def test_check_flag_runs_only_the_selected_checks(
    demo_out: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    out, _ = demo_out
    config = str(out / "configs" / "demo-policy.yaml")
    proc = paritygate("run", config, "--check", "weights_load", "--check", "head_removal",
                      "--report-dir", str(tmp_path / "r"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ran = re.findall(r"^\[paritygate\]\s+\w+\s+(\w+)", proc.stdout, re.M)
    assert ran == ["weights_load", "head_removal"]
    wrong_family = paritygate("run", config, "--check", "tokenizer_parity", cwd=tmp_path)
    assert wrong_family.returncode == 2
    assert "--check: tokenizer_parity is not a check this policy gate runs" in wrong_family.stderr
    # The same mistake in the config is the same answer, naming its key.
    for key in ("checks", "skip_checks"):
        text = (out / "configs" / "demo-policy.yaml").read_text()
        bad = tmp_path / f"bad-{key}.yaml"
        bad.write_text(text.replace("seed: 0", f"seed: 0\n{key}: [tokenizer_parity]", 1))
        proc = paritygate("run", str(bad), cwd=out / "configs")
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert proc.stderr.count("\n") == 1, proc.stderr
        assert f"{key}: tokenizer_parity is not a check this policy gate runs" in proc.stderr


def test_every_package_under_src_ships() -> None:
    """setuptools lists the packages by name: a new subpackage left out of the list installs
    from a checkout (editable) but not from the wheel."""
    tomllib = pytest.importorskip("tomllib")
    root = Path(__file__).resolve().parents[1]
    listed = set(tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
                 ["tool"]["setuptools"]["packages"])
    src = root / "src"
    found = {".".join(p.parent.relative_to(src).parts) for p in src.rglob("__init__.py")}
    assert found - listed == set()
