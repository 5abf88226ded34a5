"""TorchScript and ``.pt2`` artifacts that skip the policy's own observation normaliser are a
preprocessing fault named by ``logits_agreement`` (``normaliser_missing``, the root cause), not a
generic threshold breach; their clean twins pass. A batch axis fixed to 1 is the same
``export_integrity`` finding in both formats (a TorchScript trace was exit 2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from format_zoo import BATCH_ONE
from normaliser_subject import build, config
from policy_zoo import evaluate_all, fault_config

from paritygate.load import config_from_dict
from paritygate.rootcause import explain

CHECKS = ("weights_load", "export_integrity", "logits_agreement", "batch_invariance")


@pytest.fixture(scope="module")
def subject(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Path], Path]:
    root = tmp_path_factory.mktemp("normaliser")
    return build(root / "subject"), root


def _results(subject: tuple[dict[str, Path], Path], artifact: str) -> dict[str, Any]:
    paths, root = subject
    out = root / artifact.replace(".", "-")
    out.mkdir(exist_ok=True)
    return evaluate_all(config_from_dict(config(paths, artifact, out), out / "gate.yaml"),
                        CHECKS)


@pytest.mark.parametrize("artifact", ["skips.pt", "skips.pt2"])
def test_an_artifact_without_its_normaliser_is_named(subject: Any, artifact: str) -> None:
    got = _results(subject, artifact)
    logits = got["logits_agreement"]
    assert logits.finding_kinds() == ["normaliser_missing"], logits.message
    assert "'obs_rms' skipped" in logits.message and "mean, var" in logits.message
    assert logits.details["normaliser_missing"]["module"] == "obs_rms"
    _, root = explain(list(got.values()))
    assert root is not None and (root.check, root.kind) == ("logits_agreement",
                                                            "normaliser_missing")
    assert all(r.status != "error" for r in got.values())


@pytest.mark.parametrize("artifact", ["clean.pt", "clean.pt2"])
def test_the_artifact_with_its_normaliser_passes(subject: Any, artifact: str) -> None:
    got = _results(subject, artifact)
    assert {c: r.status for c, r in got.items()} == dict.fromkeys(CHECKS, "pass"), {
        c: r.message for c, r in got.items() if r.status != "pass"}


def test_a_batch_fixed_to_one_is_one_finding_in_every_format(clean_demo: Path,
                                                             tmp_path: Path) -> None:
    kinds = {}
    for entry in BATCH_ONE:
        out = tmp_path / entry.id
        got = evaluate_all(fault_config(clean_demo, out, entry.build(clean_demo, out)),
                           ("export_integrity", "logits_agreement"))
        integrity = got["export_integrity"]
        assert integrity.status == "fail", integrity.message
        assert "batch axis of input 'obs' is baked to the constant 1" in integrity.message
        assert got["logits_agreement"].status == "pass", got["logits_agreement"].message
        kinds[entry.id] = sorted(integrity.finding_kinds())
    assert kinds["torchscript_batch_one"] == kinds["pt2_batch_one"]
    assert "batch_axis_baked" in kinds["pt2_batch_one"]
