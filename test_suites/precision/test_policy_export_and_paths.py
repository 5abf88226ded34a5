"""The policy route into precision: path kwargs resolve like ``checkpoint``, an export runs
only when a selected check needs the artifact, and the export leaves stderr clean."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from precision_zoo import OBS, clean_policy

from paritygate.errors import InputError
from paritygate.gate import Gate
from paritygate.load import config_from_dict

FACTORIES = """
from pathlib import Path

from precision_zoo import clean_policy


def build(**kwargs):
    return clean_policy()


def build_from_spec(spec_path):
    # the path must arrive resolved against the config's folder, not the working directory
    assert Path(spec_path).is_absolute() and Path(spec_path).is_file(), spec_path
    return clean_policy()
"""


def _tiny_policy(root: Path, **policy: object) -> Path:
    """A policy gate over the precision zoo's clean model, artifact left to the gate."""
    from safetensors.torch import save_file

    root.mkdir(parents=True, exist_ok=True)
    (root / "tinyfac.py").write_text(textwrap.dedent(FACTORIES))
    save_file(
        {k: v.contiguous() for k, v in clean_policy().state_dict().items()},
        str(root / "policy.safetensors"),
    )
    np.save(
        root / "probes.npy",
        torch.randn(16, OBS, generator=torch.Generator().manual_seed(0)).numpy(),
    )
    data = {
        "name": "tiny",
        "family": "policy",
        "python_path": [".", str(Path(__file__).parent)],
        "checks": ["precision_per_layer"],
        "policy": {
            "training_factory": "tinyfac:build",
            "inference_factory": "tinyfac:build",
            "checkpoint": "policy.safetensors",
            "probes": {"file": "probes.npy", "edge_cases": False},
            **policy,
        },
        "precision": {"onnx_compare": False, "dtypes": ["float16"]},
        "golden": {"dir": "golden"},
    }
    path = root / "gate.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_no_export_when_no_selected_check_needs_the_artifact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from paritygate.families.policy import export as export_module

    calls: list[Path] = []
    real = export_module.export_onnx
    monkeypatch.setattr(
        export_module, "export_onnx", lambda *a, **kw: calls.append(a[2]) or real(*a, **kw)
    )
    config = _tiny_policy(tmp_path / "gate")
    gate = Gate.from_path(config, report_dir=tmp_path / "report")
    result = gate.evaluate("precision_per_layer", golden=False)
    assert result.status == "pass", result.message
    assert result.details["precision"]["onnx"] is None
    assert calls == []
    assert not list(tmp_path.rglob("*.onnx")), "no artifact may be written"


def test_onnx_compare_exports_once_when_no_artifact_is_configured(tmp_path: Path) -> None:
    data = yaml.safe_load(_tiny_policy(tmp_path / "gate").read_text())
    data["precision"]["onnx_compare"] = True
    config = config_from_dict(data, tmp_path / "gate" / "gate.yaml")
    gate = Gate(config, report_dir=tmp_path / "report")
    result = gate.evaluate("precision_per_layer", golden=False)
    assert result.status == "pass", result.message
    assert result.details["precision"]["onnx"]["rows"]
    assert (tmp_path / "report" / "export" / "policy.onnx").is_file()
    assert gate.context.exported_on_the_fly


def test_export_leaves_stderr_clean(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A BERT-style encoder makes the dynamo exporter's constant folding log "Evaluation
    failed: cannot reshape array of size 1 into shape (1,8)" twice (a shape on the dynamic
    batch axis); the gate silences it for the export call only."""
    import logging

    transformers = pytest.importorskip("transformers")
    from paritygate.families.policy.export import EXPORTER_NOISE_LOGGERS, export_onnx

    config = transformers.BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
    )

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = transformers.BertModel(config)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.bert(input_ids=ids).last_hidden_state

    levels = [logging.getLogger(n).level for n in EXPORTER_NOISE_LOGGERS]
    capfd.readouterr()
    export_onnx(
        Encoder().eval(),
        torch.randint(0, 100, (2, 8)),
        tmp_path / "m.onnx",
        input_name="obs",
        output_names=["logits"],
    )
    err = capfd.readouterr().err
    assert (tmp_path / "m.onnx").is_file()
    assert "Evaluation failed" not in err and "Skipping torchvision" not in err, err
    assert [logging.getLogger(n).level for n in EXPORTER_NOISE_LOGGERS] == levels, (
        "the loggers are quiet for the export call only"
    )


def test_factory_path_kwargs_resolve_relative_to_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "gate"
    config = _tiny_policy(
        root,
        training_factory="tinyfac:build_from_spec",
        inference_factory="tinyfac:build_from_spec",
        factory_kwargs={"spec_path": "specs/net.json"},
        factory_path_kwargs=["spec_path"],
    )
    (root / "specs").mkdir()
    (root / "specs" / "net.json").write_text("{}")
    monkeypatch.chdir(tmp_path)  # a working directory where the relative path does not exist
    gate = Gate.from_path(config, report_dir=tmp_path / "report")
    assert gate.evaluate("precision_per_layer", golden=False).status == "pass"


def test_factory_path_kwargs_must_name_string_kwargs(tmp_path: Path) -> None:
    data = yaml.safe_load(_tiny_policy(tmp_path / "gate").read_text())
    data["policy"]["factory_kwargs"] = {"width": 4}
    data["policy"]["factory_path_kwargs"] = ["width", "spec"]
    with pytest.raises(InputError) as info:
        config_from_dict(data, tmp_path / "gate" / "gate.yaml")
    assert "factory_path_kwargs" in str(info.value)
