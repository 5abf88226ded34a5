"""``paritygate init`` fills the RL loop's blocks: a reward model and a KL reference found beside
the checkpoint (or named), the initial policy and the KL estimator left TODO; filled, both
checks run and pass."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

from paritygate import Gate, write_config
from paritygate.errors import InputError

REPO = Path(__file__).resolve().parents[2]


def _reward_model(demo_lm: Path, out: Path) -> Path:
    """An untrained one-label Llama classifier on the demo tokenizer, saved as TRL saves one."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(demo_lm)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                         num_labels=1, pad_token_id=tok.pad_token_id)
    LlamaForSequenceClassification(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _layout(demo_lm: Path, root: Path) -> Path:
    ckpt = root / "run" / "policy"
    shutil.copytree(demo_lm, ckpt)
    shutil.copytree(demo_lm, root / "run" / "ref_model")
    _reward_model(demo_lm, root / "run" / "reward_model")
    return ckpt


def test_init_finds_reward_and_reference_beside_the_checkpoint(
    demo_lm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt = _layout(demo_lm, tmp_path)
    monkeypatch.chdir(tmp_path)
    written = write_config(ckpt, out=Path("configs/rl.yaml"), name="rl-init")
    assert "causal_lm.reference.initial" in written.todos
    assert "causal_lm.reference.kl_estimator" in written.todos
    assert any("found beside the checkpoint" in n for n in written.notes)
    section = yaml.safe_load(written.path.read_text(encoding="utf-8"))["causal_lm"]
    assert section["reward"]["model_dir"].endswith("run/reward_model")
    assert section["reference"]["model_dir"].endswith("run/ref_model")
    with pytest.raises(InputError) as refused:
        Gate.from_path(written.path)
    assert "still TODO" in refused.value.cause

    shutil.copy(REPO / "configs" / "sampling" / "demo-lm-train.yaml", "configs/trainer.yaml")
    shutil.copy(REPO / "golden" / "demo-lm" / "probes.jsonl", "configs/probes.jsonl")
    text = written.path.read_text(encoding="utf-8")
    initial = section["reference"]["model_dir"]  # the reference is the initial policy here
    for key, value in {
        "model_dir": section["model_dir"], "training": "trainer.yaml", "probes": "probes.jsonl",
        "logprob_fn": "paritygate.families.causal_lm.logprobs:compute_logprobs",
        "initial": initial, "kl_estimator": "k3",
    }.items():
        text, n = re.subn(rf'({key}: )"TODO(?:[^"\\]|\\.)*"', rf"\g<1>{value}", text, count=1)
        assert n == 1, key
    written.path.write_text(text, encoding="utf-8")
    gate = Gate.from_path(written.path)
    reward = gate.evaluate("reward_parity", golden=False)
    assert reward.status == "pass", reward.message
    # the copied reference is the policy's own tensors: the gate says so
    reference = gate.evaluate("reference_parity", golden=False)
    assert reference.status == "fail" and "reference_is_policy" in reference.finding_kinds()


def test_init_named_reward_model_must_be_a_classifier(
    demo_lm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt = _layout(demo_lm, tmp_path)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError) as err:
        write_config(ckpt, out=Path("configs/rl.yaml"), reward_model=demo_lm)
    assert err.value.key == "--reward-model"
