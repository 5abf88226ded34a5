"""``paritygate init`` on a torch checkpoint: the gate is named after the policy (never the
step), a src layout is importable, and the ``.gitignore`` entries the gate's outputs need are
proposed. Tiny hand-made checkpoints: nothing here trains."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from paritygate import write_config
from paritygate.init_infer import gitignore_proposal, head_prefixes, names_a_policy


def _checkpoint(path: Path) -> Path:
    import torch
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"pi.weight": torch.zeros(2, 3), "value_head.weight": torch.zeros(1, 3)}, str(path))
    return path


def _repo(root: Path) -> Path:
    (root / ".git").mkdir(parents=True)
    return root


def test_names_a_policy_not_a_step() -> None:
    for step in ("step_300", "checkpoint-500", "rl_model_100000_steps", "ckpt", "checkpoints",
                 "epoch3", "global_step_12k", "model", "300"):
        assert not names_a_policy(step), step
    for policy in ("ppo_cartpole", "my-policy", "policy", "walker2d_sac"):
        assert names_a_policy(policy), policy


def test_gate_is_named_after_the_repository_or_folder_not_the_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = _repo(tmp_path / "cartpole-ppo")
    monkeypatch.chdir(repo)
    first = write_config(_checkpoint(repo / "ckpt" / "step_300.safetensors"))
    assert first.path == Path("configs/cartpole-ppo.yaml")
    data = yaml.safe_load(first.path.read_text(encoding="utf-8"))
    assert data["name"] == "cartpole-ppo"
    assert "names golden/cartpole-ppo/: edit to rename" in first.path.read_text(encoding="utf-8")
    assert first.notes[0].startswith("name 'cartpole-ppo' (from the repository cartpole-ppo/")
    # the next step of the same policy gets the same name, so it gates against the same golden
    second = write_config(_checkpoint(repo / "ckpt" / "step_400.safetensors"),
                          out=Path("configs/next.yaml"))
    assert yaml.safe_load(second.path.read_text(encoding="utf-8"))["name"] == "next"
    third = write_config(_checkpoint(repo / "ckpt" / "step_500.safetensors"),
                         out=Path("configs/gate.yaml"))  # a generic file name names nothing
    assert yaml.safe_load(third.path.read_text(encoding="utf-8"))["name"] == "cartpole-ppo"
    # a folder that names the policy wins over the repository; --name over both
    walker = write_config(_checkpoint(repo / "runs" / "walker" / "checkpoint-9.safetensors"))
    assert walker.path == Path("configs/walker.yaml")
    named = write_config(repo / "runs" / "walker" / "checkpoint-9.safetensors",
                         name="walker v2")
    assert yaml.safe_load(named.path.read_text(encoding="utf-8"))["name"] == "walker-v2"


def test_src_layout_is_on_python_path_and_imports_without_installing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = _repo(tmp_path / "proj")
    (repo / "src" / "srcpkg").mkdir(parents=True)
    (repo / "src" / "srcpkg" / "__init__.py").write_text("def build():\n    return 1\n")
    (repo / "flatmod.py").write_text("def build():\n    return 2\n")
    monkeypatch.chdir(repo)
    written = write_config(_checkpoint(repo / "ckpt" / "policy.safetensors"),
                           out=Path("configs/p.yaml"))
    data = yaml.safe_load(written.path.read_text(encoding="utf-8"))
    assert data["python_path"] == ["../src", ".."]
    text = written.path.read_text(encoding="utf-8")
    for key, value in {"training_factory": "srcpkg:build", "inference_factory": "flatmod:build",
                       "policy_output": "0", "generator": "srcpkg:build"}.items():
        text, n = re.subn(rf'({key}: )"TODO(?:[^"\\]|\\.)*"', rf"\g<1>{value}", text, count=1)
        assert n == 1, key
    written.path.write_text(text, encoding="utf-8")
    check = ("from paritygate.load import load_config\n"
             "from paritygate.imports import import_callable\n"
             "c = load_config('p.yaml')\n"
             "print(import_callable('srcpkg:build', c.path, 'k')(),"
             " import_callable('flatmod:build', c.path, 'k')())\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # run from configs/: neither folder is on sys.path unless python_path adds it
    proc = subprocess.run([sys.executable, "-c", check], cwd=repo / "configs", env=env,
                          capture_output=True, text=True, check=False)
    assert proc.stdout.split() == ["1", "2"], proc.stdout + proc.stderr


def test_gitignore_entries_are_proposed_until_present(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = _repo(tmp_path / "proj")
    monkeypatch.chdir(repo)
    written = write_config(_checkpoint(repo / "ckpt" / "policy.safetensors"))
    assert written.gitignore == (repo / ".gitignore", ["*.obtained.json", "reports/"])
    assert written.notes[-1].startswith("add to .gitignore: *.obtained.json, reports/")
    (repo / ".gitignore").write_text("__pycache__/\n/reports\n**/*.obtained.json\n")
    assert gitignore_proposal(repo / "configs") == (repo / ".gitignore", [])
    again = write_config(repo / "ckpt" / "policy.safetensors", out=Path("configs/b.yaml"))
    assert not any(".gitignore" in note for note in again.notes)


def test_cleanrl_training_checkpoint_gets_a_config_that_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CleanRL continuous actor-critic saved as a training checkpoint: init finds its state
    dict's key, declares the bare log-std parameter training-only beside the critic and
    proposes a Gaussian; with only the TODOs filled in, every model check passes."""
    import torch

    from paritygate.demo.continuous import CleanRLAgent
    from paritygate.gate import Gate
    from paritygate.load import config_from_dict

    repo = _repo(tmp_path / "proj")
    monkeypatch.chdir(repo)
    torch.manual_seed(0)
    agent = CleanRLAgent()
    ckpt = repo / "runs" / "agent.pt"
    ckpt.parent.mkdir(parents=True)
    optimizer = torch.optim.Adam(agent.parameters())
    torch.save({"model": agent.state_dict(), "optimizer": optimizer.state_dict(),
                "global_step": 4096}, ckpt)
    written = write_config(ckpt, out=Path("configs/cleanrl.yaml"))
    data = yaml.safe_load(written.path.read_text())
    policy = data["policy"]
    assert policy["state_dict_key"] == "model"
    assert policy["training_heads"] == ["critic", "actor_logstd"]
    assert policy["action_space"] == "continuous"
    assert policy["distribution"]["log_std"] == "parameter"
    assert policy["distribution"]["log_std_key"] == "actor_logstd"
    assert set(written.todos) == {"policy.training_factory", "policy.inference_factory",
                                  "policy.policy_output", "policy.probes.generator",
                                  "policy.distribution.squash", "policy.distribution.action_scale",
                                  "policy.distribution.action_bias"}
    policy["distribution"].update(squash="clip", action_scale=1.0, action_bias=0.0)
    policy.update(training_factory="paritygate.demo.continuous:build_cleanrl_agent",
                  inference_factory="paritygate.demo.continuous:build_cleanrl_actor",
                  policy_output="mean", output_names=["mean"],
                  probes={"generator": "paritygate.demo.continuous:probe_observations",
                          "count": 16})
    checks = ["weights_load", "head_removal", "dropout_off", "logits_agreement"]
    gate = Gate(config_from_dict({**data, "checks": checks}, written.path),
                report_dir=repo / "reports")
    results = {cid: gate.evaluate(cid, golden=False) for cid in checks}
    assert {c: r.status for c, r in results.items()} == dict.fromkeys(checks, "pass"), {
        c: r.message for c, r in results.items() if r.status != "pass"}


def _sac_filled(data: dict[str, Any]) -> dict[str, Any]:
    """The demo SAC config init wrote, only its TODOs filled."""
    policy = data["policy"]
    policy["distribution"].update(log_std_key="log_std", log_std_clamp=[-5.0, 2.0],
                                  squash="tanh", serving_output="action")
    policy.update(training_factory="paritygate.demo.continuous:build_sac_agent",
                  inference_factory="paritygate.demo.continuous:build_sac_actor",
                  policy_output="mean", output_names=["action", "log_std"],
                  probes={"generator": "paritygate.demo.continuous:probe_observations",
                          "count": 16})
    return data


def _passes(data: dict[str, Any], path: Path, report_dir: Path) -> None:
    from paritygate.gate import Gate
    from paritygate.load import config_from_dict

    checks = ["weights_load", "head_removal", "dropout_off", "logits_agreement"]
    gate = Gate(config_from_dict({**data, "checks": checks}, path), report_dir=report_dir)
    results = {cid: gate.evaluate(cid, golden=False) for cid in checks}
    assert {c: r.status for c, r in results.items()} == dict.fromkeys(checks, "pass"), {
        c: r.message for c, r in results.items() if r.status != "pass"}


def _sac_proposal(policy: dict[str, Any]) -> None:
    dist = policy["distribution"]
    assert policy["action_space"] == "continuous"
    assert dist["log_std"] == "output"
    assert dist["action_scale"] == [2.0, 1.0] and dist["action_bias"] == [0.5, -0.25]


def test_sac_torch_checkpoint_gets_its_critics_and_gaussian(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SAC agent's safetensors (actor with ``fc_logstd`` and action_scale/bias buffers, a
    ``qf1`` critic): the critic is a training head, the Gaussian a ``log_std: output`` block
    with scale and bias from the buffers and the rest TODO; filled, the checks pass."""
    import torch
    from safetensors.torch import save_file

    from paritygate.demo.continuous import SACAgent

    repo = _repo(tmp_path / "proj")
    monkeypatch.chdir(repo)
    torch.manual_seed(0)
    ckpt = repo / "runs" / "sac.safetensors"
    ckpt.parent.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in SACAgent().state_dict().items()}, str(ckpt))
    written = write_config(ckpt, out=Path("configs/sac.yaml"))
    data = yaml.safe_load(written.path.read_text())
    assert data["policy"]["training_heads"] == ["qf1"]
    _sac_proposal(data["policy"])
    assert set(written.todos) == {
        "policy.training_factory", "policy.inference_factory", "policy.policy_output",
        "policy.probes.generator", "policy.distribution.log_std_key",
        "policy.distribution.log_std_clamp", "policy.distribution.squash",
        "policy.distribution.serving_output"}
    _passes(_sac_filled(data), written.path, repo / "reports")


def test_q_network_names_are_heads() -> None:
    keys = [f"{m}.0.weight" for m in ("actor", "qf1", "qf2", "q1", "critic_target", "qformer")]
    assert head_prefixes(keys) == ["qf1", "qf2", "q1", "critic_target"]


def test_nested_training_state_gets_its_state_dict_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``{"agent": {"sac": sd}, "optim": ..., "global_step": N}``: no common name holds the
    state dict, init finds it one level further down and writes ``state_dict_key:
    agent.sac`` (filled, the checks pass); with two such mappings the key is TODO listing
    both."""
    import torch

    from paritygate.demo.continuous import SACAgent

    repo = _repo(tmp_path / "proj")
    monkeypatch.chdir(repo)
    torch.manual_seed(0)
    agent = SACAgent()
    ckpt = repo / "runs" / "train_state.pt"
    ckpt.parent.mkdir(parents=True)
    optimizer = torch.optim.Adam(agent.parameters())
    torch.save({"agent": {"sac": agent.state_dict()}, "optim": optimizer.state_dict(),
                "global_step": 1000}, ckpt)
    written = write_config(ckpt, out=Path("configs/train-state.yaml"))
    data = yaml.safe_load(written.path.read_text())
    assert data["policy"]["state_dict_key"] == "agent.sac"
    _sac_proposal(data["policy"])
    _passes(_sac_filled(data), written.path, repo / "reports")

    two = repo / "runs" / "two.pt"
    torch.save({"agent": {"sac": agent.state_dict(), "qf": agent.qf1.state_dict()},
                "global_step": 1000}, two)
    written = write_config(two, out=Path("configs/two.yaml"))
    assert "policy.state_dict_key" in written.todos
    key = yaml.safe_load(written.path.read_text())["policy"]["state_dict_key"]
    assert key.startswith("TODO") and "agent.sac, agent.qf" in key


_SHAPE_CHECKS = ["weights_load", "batchnorm_export", "head_removal", "dropout_off",
                 "logits_agreement", "export_integrity"]


def _init_and_gate(folder: Path, tmp: Path, fill: dict[str, object],
                   checks: list[str]) -> tuple[dict[str, object], list[str], dict[str, object]]:
    """init on ``folder``'s checkpoint (its artifact beside it), the TODOs filled with
    ``fill``; returns the proposed policy section, its TODOs and the check statuses."""
    from paritygate.gate import Gate
    from paritygate.load import config_from_dict

    written = write_config(folder / "policy.safetensors", out=tmp / "configs" / "subject.yaml")
    data = yaml.safe_load(written.path.read_text())
    proposed = dict(data["policy"])
    data["policy"].update(fill)
    gate = Gate(config_from_dict({**data, "checks": checks}, written.path),
                report_dir=tmp / "reports")
    results = {cid: gate.evaluate(cid, golden=False) for cid in checks}
    statuses = {c: (r.status, r.message) for c, r in results.items()}
    return proposed, written.todos, statuses


def test_init_proposes_the_inputs_of_a_dict_artifact(
    build_once, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from paritygate.demo import shapes

    folder = build_once("demo-shapes-dict", shapes.build_dict)
    monkeypatch.chdir(tmp_path)
    mod = "paritygate.demo.shapes"
    proposed, todos, statuses = _init_and_gate(folder, tmp_path, {
        "training_factory": f"{mod}:build_dict_training",
        "inference_factory": f"{mod}:build_dict_inference",
        "policy_output": "logits", "call": "dict",
        "probes": {"generator": f"{mod}:dict_probes", "count": 16}}, _SHAPE_CHECKS)
    assert set(todos) == {"policy.training_factory", "policy.inference_factory",
                          "policy.policy_output", "policy.call", "policy.probes.generator"}
    expected = shapes.dict_config(folder)["policy"]["inputs"]
    assert proposed["inputs"] == [{"name": i["name"], "shape": i["shape"]} for i in expected]
    assert "input_name" not in proposed and "recurrent" not in proposed
    assert all(s == "pass" for s, _ in statuses.values()), statuses


def test_init_proposes_the_state_pairs_of_a_recurrent_artifact(
    build_once, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from paritygate.demo import shapes

    folder = build_once("demo-shapes-recurrent", shapes.build_recurrent)
    monkeypatch.chdir(tmp_path)
    mod = "paritygate.demo.shapes"
    proposed, todos, statuses = _init_and_gate(folder, tmp_path, {
        "training_factory": f"{mod}:build_recurrent_training",
        "inference_factory": f"{mod}:build_recurrent_inference",
        "policy_output": 0,
        "probes": {"generator": f"{mod}:recurrent_probes", "count": 16}},
        [*_SHAPE_CHECKS, "recurrent_parity"])
    assert set(todos) == {"policy.training_factory", "policy.inference_factory",
                          "policy.policy_output", "policy.probes.generator"}
    demo = shapes.recurrent_config(folder)["policy"]
    assert proposed["inputs"] == [{"name": "obs", "shape": [shapes.OBS_DIM]},
                                  "h_in", "c_in", "episode_start"]
    assert proposed["recurrent"] == {"states": demo["recurrent"]["states"],
                                     "episode_start": "episode_start"}
    assert proposed["output_names"] == demo["output_names"]
    assert all(s == "pass" for s, _ in statuses.values()), statuses


def test_state_pairs_are_guessed_by_name_and_unknown_shapes_are_todo() -> None:
    from paritygate.init_inputs import inputs_block, layout
    from paritygate.init_yaml import ConfigDoc

    def written(found: object) -> object:
        doc = ConfigDoc()
        inputs_block(doc.root.block("policy"), found, "x", None)  # type: ignore[arg-type]
        return yaml.safe_load(doc.dump())

    found = layout([("obs", ["batch", 8]), ("state_in_h", ["batch", 32]),
                    ("prev_c", ["batch", "hidden"]), ("dones", ["batch"])],
                   ["action", "state_out_h", "next_c"])
    assert found.states == [("state_in_h", "state_out_h", [32]), ("prev_c", "next_c", None)]
    assert found.episode_start == "dones" and found.observations == [("obs", [8])]
    data = written(found)
    from paritygate.init_infer import find_todos

    assert find_todos(data) == ["policy.recurrent.states[1].shape"]
    # no state: a flag-like name is an observation; several observations leave call TODO
    plain = layout([("image", ["b", 1, 6, 6]), ("done", ["b"])], ["logits"])
    assert not plain.recurrent and [n for n, _ in plain.observations] == ["image", "done"]
    assert find_todos(written(plain)) == ["policy.call"]


def test_an_artifact_in_no_format_the_gate_reads_is_refused_naming_the_formats(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from paritygate.errors import InputError

    monkeypatch.chdir(tmp_path)
    ckpt = _checkpoint(tmp_path / "runs" / "agent.safetensors")
    artifact = tmp_path / "ship" / "policy.bin"
    artifact.parent.mkdir()
    artifact.write_bytes(b"\x00not a model\x00" * 8)
    with pytest.raises(InputError) as refused:
        write_config(ckpt, out=Path("configs/agent.yaml"), artifact=artifact)
    assert refused.value.key == "--artifact"
    assert "TorchScript" in str(refused.value) and ".pt2" in str(refused.value)
    assert not (tmp_path / "configs" / "agent.yaml").exists()
