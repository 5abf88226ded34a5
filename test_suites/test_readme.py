"""The README's config examples stay valid configs."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from paritygate.config import config_from_dict

README = Path(__file__).resolve().parents[1] / "README.md"
STUB_POLICY = {
    "training_factory": "m:f",
    "inference_factory": "m:g",
    "checkpoint": "c.safetensors",
    "probes": {"generator": "m:p"},
}


def test_readme_yaml_examples_validate(tmp_path: Path) -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert len(blocks) >= 4
    for block in blocks:
        data = yaml.safe_load(block)
        if "name" not in data:  # a fragment: complete it with a stub policy gate
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
    assert "python -m pytest test_suites -q -n 2 -p no:cacheprovider" in ci
    assert "python -m pytest test_suites -q -n 2 -p no:cacheprovider" in commands[1]
