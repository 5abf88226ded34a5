"""The precision fault zoo: each fault fails naming its layer; the clean model passes."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from precision_zoo import FakeContext, clean_policy, measure, rescaled_policy, subject

from paritygate.golden import GoldenStore, regression_check
from paritygate.verdict import Margin, judge


def test_clean_policy_passes(clean_measurement) -> None:
    result = judge(clean_measurement, None, use_golden=False)
    assert result.status == "pass", result.message
    names = [n for n in clean_measurement.metrics if n.endswith("/local_rel_l2")]
    assert "fp16/blocks.1.up/local_rel_l2" in names and "bf16/blocks.1/local_rel_l2" in names
    assert clean_measurement.metrics["fp16/output_rel_l2"].key


def test_fp16_overflow_fails_naming_the_layer_and_a_verified_fp32_fix() -> None:
    m = measure(FakeContext(subject(lambda: rescaled_policy(16))))
    result = judge(m, None, use_golden=False)
    assert result.status == "fail"
    assert "float16: first divergent layer 'blocks.1.up'" in result.message
    assert "Inf" in result.message
    # weights within range (|w| * 2^16 < 65504 here): only the activations are blamed
    assert "weights themselves overflow" not in result.message


def test_weights_beyond_the_format_range_are_named_as_the_cause() -> None:
    m = measure(FakeContext(subject(lambda: rescaled_policy(20))))
    result = judge(m, None, use_golden=False)
    assert result.status == "fail"
    assert "float16: first divergent layer 'blocks.1.up'" in result.message
    assert "its weights themselves overflow" in result.message
    assert "of blocks.1.up.weight exceed float16's largest finite value" in result.message
    mixed = m.details["precision"]["summary"]["float16"]["mixed"]
    assert mixed["verified"] and mixed["keep_fp32"]
    assert all(name.startswith("blocks.1") for name in mixed["keep_fp32"])
    assert (
        float(mixed["output_rel_l2"])
        <= m.details["precision"]["summary"]["float16"]["output_budget"]
    )
    # bfloat16 has float32's exponent range: no overflow there
    assert m.details["precision"]["summary"]["bfloat16"]["first_divergent"] is None


def test_layer_error_jump_against_golden_fails_inside_its_budget(
    tmp_path: Path, clean_measurement
) -> None:
    store = GoldenStore(tmp_path / "golden")
    blessed = regression_check(
        clean_measurement, store, margin=Margin(), blessing=True,
        probes_sha256=lambda: "p", provenance=lambda: {"checkpoint": "clean"},
        bless_command="bless",
    )  # fmt: skip
    assert blessed.status == "pass", blessed.message
    golden = store.load("precision_per_layer")
    # per-layer baselines live in their own file, the headline golden stays short
    assert "fp16/blocks.1.up/local_rel_l2" in golden["detail_metrics"]
    assert not any("/blocks." in name for name in golden["metrics"])
    assert store.detail_path("precision_per_layer").is_file()

    assert judge(clean_measurement, golden).status == "pass"
    faulty = measure(FakeContext(subject(lambda: rescaled_policy(-14))))
    metric = faulty.metrics["fp16/blocks.1.up/local_rel_l2"]
    assert not metric.breaches(), "the fault must stay inside its absolute budget"
    without_golden = judge(faulty, None, use_golden=False)
    assert without_golden.status == "pass", without_golden.message
    result = judge(faulty, golden)
    assert result.status == "fail"
    assert "fp16/blocks.1.up/local_rel_l2 regressed vs golden" in result.message
    assert "fp16/blocks.1.up/local_rel_l2" in result.failed_metrics
    assert "fp16/blocks.1.up/local_rel_l2" not in result.metrics  # a detail metric
    assert result.key_metric in result.metrics


def _altered(clean: Path, out: Path) -> Path:
    """Copy of the artifact whose blocks.1.norm LayerNormalization has epsilon 1e-3 (was 1e-5)."""
    model = onnx.load(str(clean))
    for node in model.graph.node:
        scopes = next(
            (p.value for p in node.metadata_props if p.key == "pkg.torch.onnx.name_scopes"), ""
        )
        if node.op_type == "LayerNormalization" and "'blocks.1.norm'" in scopes:
            for attr in node.attribute:
                if attr.name == "epsilon":
                    attr.f = 1e-3
            break
    else:
        pytest.fail("no LayerNormalization of blocks.1.norm in the export")
    onnx.save(model, str(out))
    return out


def test_onnx_artifact_with_one_altered_node_fails_naming_the_layer(
    clean_onnx: Path, tmp_path: Path
) -> None:
    altered = _altered(clean_onnx, tmp_path / "altered.onnx")
    before = altered.read_bytes()
    m = measure(FakeContext(subject(clean_policy, onnx_path=altered)))
    result = judge(m, None, use_golden=False)
    assert result.status == "fail"
    assert "ONNX artifact (float32): first divergent layer 'blocks.1.norm'" in result.message
    assert m.metrics["onnx/output_rel_l2"].breaches()
    assert altered.read_bytes() == before, "the artifact file must never be modified"


def test_clean_onnx_fp32_and_fp16_artifacts_pass(clean_onnx: Path, tmp_path: Path) -> None:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    fp16 = tmp_path / "clean16.onnx"
    onnx.save(convert_float_to_float16(onnx.load(str(clean_onnx)), keep_io_types=True), str(fp16))
    for path, dtype in ((clean_onnx, "float32"), (fp16, "float16")):
        m = measure(FakeContext(subject(clean_policy, onnx_path=path)))
        result = judge(m, None, use_golden=False)
        assert result.status == "pass", result.message
        report = m.details["precision"]["onnx"]
        assert report["dtype"] == dtype
        assert not report["unmapped"]
        assert {r["layer"] for r in report["rows"]} >= {"inp", "blocks.0.up", "blocks.2", "head"}


def test_rounding_noise_floor_lets_a_later_clean_checkpoint_pass(
    tmp_path: Path, clean_measurement
) -> None:
    """Each error metric declares rounding's own size as its noise floor (u for a layer,
    u * sqrt(depth) for the output): a later clean checkpoint that is another draw of the
    same rounding (a trained LM's bf16 output error moved 5x between two saves) passes, an
    error beyond three floors still regresses."""
    import dataclasses

    from paritygate.precision.budgets import unit_roundoff

    store = GoldenStore(tmp_path / "golden")
    regression_check(
        clean_measurement, store, margin=Margin(), blessing=True,
        probes_sha256=lambda: "p", provenance=lambda: {"checkpoint": "clean"},
        bless_command="bless",
    )  # fmt: skip
    golden = store.load("precision_per_layer")
    out = clean_measurement.metrics["bf16/output_rel_l2"]
    assert out.noise == pytest.approx(out.threshold / 8.0)  # output_budget_ulps
    local = clean_measurement.metrics["bf16/blocks.1/local_rel_l2"]
    assert local.noise == unit_roundoff("bfloat16")

    def moved(value: float) -> object:
        metrics = dict(clean_measurement.metrics)
        metrics[out.name] = dataclasses.replace(out, value=value)
        return dataclasses.replace(clean_measurement, metrics=metrics)

    blessed = float(out.value)
    redraw = moved(blessed + 2.5 * out.noise)  # within 3 floors: rounding
    assert judge(redraw, golden).status == "pass"
    drift = moved(blessed + 3.5 * out.noise)
    assert not drift.metrics[out.name].breaches()
    result = judge(drift, golden)
    assert result.status == "fail" and "bf16/output_rel_l2 regressed vs golden" in result.message
