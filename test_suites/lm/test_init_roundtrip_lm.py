"""Every causal-LM layout ``paritygate init`` accepts, round-tripped as docs/init.md tells a
user: a trainer's ``output_dir`` (TRL ``GRPOTrainer``, two saves), one of its ``checkpoint-N``
folders, a PEFT adapter directory and a plain HF model directory. ``init`` writes the config,
every TODO is answered and nothing else (:func:`init_fill.fill`, through ruamel: comments
kept), and ``paritygate run`` blesses the clean subject with exit 0.

The TRL run is the seeded 4-step run ``test_trainer_output.py`` gates (``build_once``: trained
once per test run); the adapter is the LM zoo's LoRA, served as its re-merged copy.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from init_fill import fill, run_cli

REPO = Path(__file__).resolve().parents[2]
CHECKS = ("weights_load", "tokenizer_parity", "sampling_config", "logprob_delta")
LOGPROB_FN = "paritygate.families.causal_lm.logprobs:compute_logprobs"


@pytest.fixture(scope="module")
def grpo(build_once: Any) -> Path:
    import trl_run

    return build_once("grpo-run", trl_run.build, seed=0)  # type: ignore[no-any-return]


def _answers(serving: str | None, sampling: Path, probes: Path) -> dict[str, object]:
    """The four TODOs of a causal-LM config, answered as docs/init.md says."""
    return {"causal_lm.serving.model_dir": serving,
            "causal_lm.sampling.training": str(sampling),
            "causal_lm.probes": str(probes),
            "causal_lm.training.logprob_fn": LOGPROB_FN}


def _round_trip(root: Path, capfd: Any, source: Path, answers: dict[str, object]) -> int:
    code, out, err = run_cli(["init", str(source), "--out", "configs/lm.yaml"], root, capfd)
    assert code == 0, out + err
    config = root / "configs" / "lm.yaml"
    fill(config, answers)
    args = ["run", str(config), "--update-golden", "--report-dir", "reports"]
    for cid in CHECKS:
        args += ["--check", cid]
    code, out, err = run_cli(args, root, capfd)
    assert code == 0, out[-3000:] + err[-3000:]
    return code


@pytest.mark.parametrize("layout", ["output_dir", "checkpoint-N"])
def test_trl_output_dir_and_checkpoint(layout: str, grpo: Path, tmp_path: Path,
                                       capfd: Any) -> None:
    """The output_dir's config names the output_dir and ``checkpoint: latest``; its serving
    copy answered ``null`` is the gated checkpoint-N itself (the run once failed on an
    unknown ``serving.checkpoint`` key, and on the output_dir's missing generation config)."""
    import yaml

    source = grpo / "grpo_out" / ("checkpoint-2" if layout == "checkpoint-N" else "")
    answers = _answers(None, grpo / "gate" / "trainer.yaml", grpo / "gate" / "probes.jsonl")
    assert _round_trip(tmp_path, capfd, source, answers) == 0
    section = yaml.safe_load((tmp_path / "configs" / "lm.yaml").read_text())["causal_lm"]
    if layout == "output_dir":
        assert section["checkpoint"] == "latest" and "checkpoint" not in section["serving"]


def test_hf_model_dir(demo_lm: Path, tmp_path: Path, capfd: Any) -> None:
    shutil.copy(REPO / "configs" / "sampling" / "demo-lm-train.yaml", tmp_path / "trainer.yaml")
    answers = _answers(None, tmp_path / "trainer.yaml",
                       REPO / "golden" / "demo-lm" / "probes.jsonl")
    if (demo_lm.parent / "reference").is_dir():  # init finds the demo's KL reference beside it
        answers["causal_lm.reference.initial"] = str(demo_lm.parent / "initial")
        answers["causal_lm.reference.kl_estimator"] = "k3"
    assert _round_trip(tmp_path, capfd, demo_lm, answers) == 0


def test_peft_adapter(lm_variants: Any, tmp_path: Path, capfd: Any) -> None:
    from lm_zoo import _lora_build

    build = _lora_build(lm_variants.model_dir, lm_variants.root)
    shutil.copy(REPO / "configs" / "sampling" / "demo-lm-train.yaml", tmp_path / "trainer.yaml")
    answers = _answers(str(build / "remerged"), tmp_path / "trainer.yaml",
                       REPO / "golden" / "demo-lm" / "probes.jsonl")
    assert _round_trip(tmp_path, capfd, build / "adapter", answers) == 0


def test_an_artifact_for_a_model_directory_is_bad_input(demo_lm: Path, tmp_path: Path,
                                                        capfd: Any) -> None:
    """A causal LM is gated from its directories, never an artifact: ``--artifact`` is exit 2
    naming it."""
    (tmp_path / "policy.onnx").write_bytes(b"x")
    code, _, err = run_cli(["init", str(demo_lm), "--out", "configs/lm.yaml", "--artifact",
                            str(tmp_path / "policy.onnx")], tmp_path, capfd)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and ": --artifact: " in lines[0], err
