"""Causal-LM test fixtures: the demo LM is built once per session; faulty variants are
derived from it as modified copies, never by editing the clean one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

REPO_ROOT = Path(__file__).resolve().parents[2]


class Variants:
    """Gates over the clean demo and each fault of :mod:`lm_zoo`, built on first use;
    ``engines`` replaces the configs' ``causal_lm.engines`` (``[hf, vllm]`` asks for vLLM)."""

    def __init__(self, model_dir: Path, root: Path, engines: list[str] | None = None) -> None:
        self.model_dir = model_dir
        self.root = root
        self.engines = engines
        self._gates: dict[str, Any] = {}
        self._results: dict[tuple[str, str], Any] = {}

    def gate(self, name: str) -> Any:
        from lm_zoo import (
            CLEAN_VARIANTS,
            FAULTS,
            SAMPLING_VARIANTS,
            VLLM_ONLY_FAULTS,
            variant_config,
        )

        from paritygate.gate import Gate
        from paritygate.load import config_from_dict

        if name not in self._gates:
            fault = (
                None
                if name == "clean"
                else next(
                    f for f in FAULTS + CLEAN_VARIANTS + VLLM_ONLY_FAULTS + SAMPLING_VARIANTS
                    if f.name == name
                )
            )
            out = self.root / name
            out.mkdir(parents=True, exist_ok=True)
            data = variant_config(self.model_dir, out, fault)
            data["name"] = f"lm-{name}".replace("_", "-")
            if self.engines is not None:
                data["causal_lm"]["engines"] = list(self.engines)
            self._gates[name] = Gate(config_from_dict(data, out / "gate.yaml"))
        return self._gates[name]

    def evaluate(self, name: str, check_id: str) -> Any:
        key = (name, check_id)
        if key not in self._results:
            self._results[key] = self.gate(name).evaluate(check_id, golden=False)
        return self._results[key]


@pytest.fixture(scope="session")
def demo_lm(build_once: Any) -> Path:
    """The demo LM, trained once per test run (shared by xdist workers); read-only.
    ``PARITYGATE_TEST_DEMO_LM=DIR`` reuses the model directory ``paritygate demo --only lm``
    built from this checkout (``DIR`` = ``demo/lm/model``, relative to the working directory or
    the repository root), as .ci/run's vLLM step does (its shape is checked against this
    checkout's demo)."""
    import os

    from paritygate.demo import causal_lm

    prebuilt = os.environ.get("PARITYGATE_TEST_DEMO_LM")
    if prebuilt:
        import json

        model_dir = _resolve_prebuilt(prebuilt)
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
        shape = (config["hidden_size"], config["num_attention_heads"], config["num_hidden_layers"])
        assert shape == (causal_lm.HIDDEN, causal_lm.HEADS, causal_lm.LAYERS), (
            f"PARITYGATE_TEST_DEMO_LM={prebuilt} is another demo build: rebuild it"
        )
        return model_dir
    return build_once("demo-lm", causal_lm.build, seed=0) / "model"


def _resolve_prebuilt(prebuilt: str) -> Path:
    """``PARITYGATE_TEST_DEMO_LM`` as an absolute directory: a relative one is read from the
    working directory, else from the repository root (gate configs resolve their paths
    against the config file, so a relative model directory would point elsewhere)."""
    path = Path(prebuilt).expanduser()
    candidates = [path] if path.is_absolute() else [Path.cwd() / path, REPO_ROOT / path]
    for candidate in candidates:
        if (candidate / "config.json").is_file():
            return candidate.resolve()
    tried = ", ".join(str(c) for c in candidates)
    pytest.fail(
        f"PARITYGATE_TEST_DEMO_LM={prebuilt}: no config.json in {tried} "
        "(build it with: paritygate demo --out demo --only lm)",
        pytrace=False,
    )


@pytest.fixture(scope="session")
def lm_variants(demo_lm: Path, tmp_path_factory: pytest.TempPathFactory) -> Variants:
    return Variants(demo_lm, tmp_path_factory.mktemp("lm-variants"))


@pytest.fixture(scope="session")
def vllm_variants(demo_lm: Path, tmp_path_factory: pytest.TempPathFactory) -> Variants:
    """The zoo's variants with ``engines: [hf, vllm]``: their configs ask for vLLM, so
    ``vllm_delta`` runs (``logprob_delta`` and ``generation_parity`` stay on HF)."""
    return Variants(demo_lm, tmp_path_factory.mktemp("vllm-variants"), engines=["hf", "vllm"])
