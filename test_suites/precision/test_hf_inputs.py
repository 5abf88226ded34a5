"""hf_model inputs that must end in a true report or one named refusal (exit 2).

A GPT-2 whose tokenizer has no pad token still gets padded text probes; a model
directory without tokenizer files is refused by name (transformers would build a
stand-in tokenizer from config.json that maps every word to one unknown token); a
truncated safetensors file is named as the file at fault. Every bad file inside the model
directory or the probe file is one line naming the file and the config key that leads to it.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
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
    from paritygate.gate import Gate
    from paritygate.load import load_config

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


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghijklmnopqrstuvwxyz"]
    directory = tmp_path_factory.mktemp("bert") / "bert"
    directory.mkdir()
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n")
    transformers.BertTokenizerFast(vocab_file=str(directory / "vocab.txt")).save_pretrained(
        directory
    )
    torch.manual_seed(0)
    transformers.BertModel(transformers.BertConfig(
        vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=32)).save_pretrained(directory)  # fmt: skip
    return directory


def _empty(src: Path, d: Path) -> tuple[Path, Path]:
    (d / "model").mkdir()
    return d / "model", d / "model" / "config.json"


def _truncated(src: Path, d: Path) -> tuple[Path, Path]:
    shutil.copytree(src, d / "model")
    data = (d / "model" / "model.safetensors").read_bytes()
    (d / "model" / "model.safetensors").write_bytes(data[: len(data) // 2])
    return d / "model", d / "model" / "model.safetensors"


def _pickle_only(src: Path, d: Path) -> tuple[Path, Path]:
    shutil.copytree(src, d / "model", ignore=shutil.ignore_patterns("*.safetensors"))
    torch.save({"embeddings.word_embeddings.weight": torch.zeros(2, 2)},
               d / "model" / "pytorch_model.bin")  # fmt: skip
    return d / "model", d / "model" / "pytorch_model.bin"


def _unknown_model_type(src: Path, d: Path) -> tuple[Path, Path]:
    shutil.copytree(src, d / "model")
    config = json.loads((d / "model" / "config.json").read_text())
    (d / "model" / "config.json").write_text(json.dumps({**config, "model_type": "bertish"}))
    return d / "model", d / "model" / "config.json"


def _npz_without_input_ids(src: Path, d: Path) -> tuple[Path, Path]:
    np.savez(d / "probes.npz", tokens=np.ones((2, 4), dtype=np.int64))
    return src, d / "probes.npz"


def _jsonl_line_without_text(src: Path, d: Path) -> tuple[Path, Path]:
    (d / "probes.jsonl").write_text('{"text": "a b c"}\n{"txt": "d e"}\n')
    return src, d / "probes.jsonl"


@pytest.mark.parametrize(("make", "key", "cause"), [
    (_empty, "hf_model.model_dir", "no config.json"),
    (_truncated, "hf_model.model_dir", "truncated or corrupt"),
    (_pickle_only, "hf_model.model_dir", "pickle"),
    (_unknown_model_type, "hf_model.model_dir", "'bertish' is not a transformers architecture"),
    (_npz_without_input_ids, "hf_model.probes: input_ids", "no input_ids array"),
    (_jsonl_line_without_text, "hf_model.probes: line 2.text", "needs a string 'text'"),
], ids=["empty-dir", "truncated-safetensors", "pickle-only", "unknown-model-type",
        "npz-without-input-ids", "jsonl-line-without-text"])  # fmt: skip
def test_a_bad_file_names_the_file_and_its_config_key(
    bert_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    make: Callable[[Path, Path], tuple[Path, Path]],
    key: str,
    cause: str,
) -> None:
    model_dir, bad = make(bert_dir, tmp_path)
    probes = bad if bad.parent == tmp_path else tmp_path / "probes.txt"
    (tmp_path / "probes.txt").write_text("\n".join(TEXTS) + "\n")
    config = tmp_path / "gate.yaml"
    config.write_text(f"name: bert\nfamily: hf_model\nhf_model:\n  model_dir: {model_dir}\n"
                      f"  probes: {probes.name}\n")  # fmt: skip
    code = main(["precision", str(config), "--report-dir", str(tmp_path / "report")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"paritygate: error: {bad}: {key}: "), err[0]
    assert cause in err[0], err[0]
