"""hf_model inputs that must end in a true report or one named refusal (exit 2).

A GPT-2 whose tokenizer has no pad token still gets padded text probes; a model
directory without tokenizer files is refused by name (transformers would build a
stand-in tokenizer from config.json that maps every word to one unknown token); a
truncated safetensors file is named as the file at fault.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import transformers

from paritygate.cli import main

TEXTS = ["a short probe", "a somewhat longer probe text than the first one", "mid length one"]


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from paritygate.demo.causal_lm import CORPUS, _train_tokenizer

    lines = [ln for ln in CORPUS.read_text(encoding="utf-8").splitlines() if ln.strip()]
    tok = _train_tokenizer(lines)
    tok.pad_token = None  # GPT-2's tokenizer has none
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=len(tok), n_embd=48, n_layer=2, n_head=4, n_positions=64))  # fmt: skip
    directory = tmp_path_factory.mktemp("gpt2") / "gpt2"
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


def _config(root: Path, model_dir: Path) -> Path:
    (root / "probes.txt").write_text("\n".join(TEXTS) + "\n")
    path = root / "gate.yaml"
    path.write_text(
        f"name: gpt2\nfamily: hf_model\ngolden: {{dir: {root / 'golden'}}}\n"
        f"hf_model:\n  model_dir: {model_dir}\n  probes: probes.txt\n"
        "precision: {suggest_mixed: false}\n"
    )
    return path


def test_text_probes_pad_without_a_pad_token(gpt2_dir: Path, tmp_path: Path) -> None:
    from paritygate.config import load_config
    from paritygate.gate import Gate

    gate = Gate(load_config(_config(tmp_path, gpt2_dir)))
    batch = gate.context.batches[0][1]
    assert batch["input_ids"].shape[0] == len(TEXTS) and bool((batch["attention_mask"] == 0).any())
    result = gate.evaluate("precision_per_layer", golden=False)
    assert result.status == "pass", result.reasons


def test_a_model_dir_without_tokenizer_files_is_refused(
    gpt2_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(gpt2_dir / name, bare / name)
    code = main(["precision", str(_config(tmp_path, bare))])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert str(bare) in err[0] and "hf_model.tokenizer" in err[0]
    assert "no tokenizer files" in err[0]


def test_a_truncated_safetensors_is_named(
    gpt2_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cut = tmp_path / "cut"
    shutil.copytree(gpt2_dir, cut)
    data = (cut / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(data[: len(data) // 2])
    code = main(["precision", str(_config(tmp_path, cut))])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert str(cut / "model.safetensors") in err[0] and "truncated or corrupt" in err[0]


def test_a_first_precision_run_names_its_own_bless_command(
    gpt2_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path, gpt2_dir)
    assert main(["precision", str(config), "--report-dir", str(tmp_path / "r1")]) == 1
    assert f"Bless with: paritygate precision {config} --update-golden" in capsys.readouterr().out
    assert main(["precision", str(config), "--update-golden", "--report-dir",
                 str(tmp_path / "r2")]) == 0  # fmt: skip
    assert main(["precision", str(config), "--report-dir", str(tmp_path / "r3")]) == 0
