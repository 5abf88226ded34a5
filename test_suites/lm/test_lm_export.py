"""`paritygate export` on a causal-LM config: the serving copy, heads removed, nothing else."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import yaml


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.iterdir()) if p.is_file()}


def test_export_writes_serving_copy_without_training_heads(demo_lm: Path, tmp_path: Path) -> None:
    from lm_zoo import clean_config
    from safetensors.torch import load_file

    from paritygate.cli import main

    cfg = tmp_path / "gate.yaml"
    cfg.write_text(yaml.safe_dump(clean_config(demo_lm)), encoding="utf-8")
    before = _digests(demo_lm)
    out = tmp_path / "export"
    assert main(["export", str(cfg), "--out", str(out)]) == 0
    assert _digests(demo_lm) == before  # the training directory is only read

    source = load_file(str(demo_lm / "model.safetensors"))
    served = load_file(str(out / "model" / "model.safetensors"))
    heads = [k for k in source if k.startswith("v_head.")]
    assert heads, "the demo checkpoint carries a TRL value head"
    assert sorted(served) == sorted(k for k in source if not k.startswith("v_head."))
    assert all(served[k].dtype == source[k].dtype and bool((served[k] == source[k]).all())
               for k in served)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["removed_keys"] == sorted(heads)
    assert manifest["files"]["model.safetensors"] == _digests(out / "model")["model.safetensors"]
    assert (out / "model" / "config.json").is_file()
