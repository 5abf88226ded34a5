"""``paritygate.mismatch``: the in-loop meter agrees with the gate's statistics, names each fault
shape on a faulty batch and passes its clean twin, takes torch or numpy, and stays lazy."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import paritygate
from paritygate.metrics.logprob import delta_stats

README = Path(__file__).resolve().parents[2] / "docs" / "training.md"


def _batch(seed: int = 0, shape: tuple[int, int] = (16, 64)) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    logp_infer = -rng.uniform(0.01, 6.0, size=shape)
    mask = rng.uniform(size=shape) > 0.2
    return logp_infer, mask


def test_clean_batch_is_consistent_and_matches_delta_stats() -> None:
    logp_infer, mask = _batch()
    rng = np.random.default_rng(1)
    logp_train = logp_infer + 1e-7 * rng.standard_normal(logp_infer.shape)
    m = paritygate.mismatch(logp_train, logp_infer, mask)
    ref = delta_stats(logp_train, logp_infer, mask)
    assert m.consistent and m.labels == ("consistent",)
    assert m.n_tokens == ref.n_tokens == int(mask.sum())
    assert m.delta_mean == pytest.approx(ref.delta_mean, rel=1e-12)
    assert m.delta_std == pytest.approx(ref.delta_std, rel=1e-9)
    assert m.delta_max_abs == ref.delta_max_abs
    assert m.delta_p99_abs == ref.delta_p99_abs
    assert m.mismatch_k3_kl == pytest.approx(ref.k3_kl, rel=1e-12)
    assert m.mismatch_kl == pytest.approx(-ref.delta_mean, rel=1e-12)
    assert m.probs_diff_max == pytest.approx(ref.prob_diff_max, rel=1e-12)
    assert m.ratio_clip_frac == ref.ratio_outside_frac
    assert m.is_eff_sample_size == pytest.approx(ref.correction["ess"], rel=1e-12)
    assert m.chi2_token == pytest.approx(ref.correction["chi2"], rel=1e-12)
    assert m.is_ratio_mean == pytest.approx(ref.correction["token_ratio_mean"], rel=1e-12)
    assert m.probs_pearson_corr == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize(
    ("fault", "label"),
    [("bias", "systematic bias"), ("noise", "noise"), ("outlier", "outlier tokens"),
     ("misaligned", "misalignment"), ("nan", "non-finite")],
)
def test_each_fault_is_named_and_its_clean_twin_passes(fault: str, label: str) -> None:
    logp_infer, mask = _batch(2)
    clean = paritygate.mismatch(logp_infer.copy(), logp_infer, mask, tier="bf16/bf16")
    assert clean.consistent, clean.diagnosis
    faulty = logp_infer.copy()
    rng = np.random.default_rng(3)
    if fault == "bias":
        faulty += 0.1
    elif fault == "noise":
        faulty += 0.3 * rng.standard_normal(faulty.shape)
    elif fault == "outlier":
        faulty[0, np.argmax(mask[0])] -= 8.0
    elif fault == "misaligned":
        faulty = np.roll(faulty, 1, axis=1)
    else:
        faulty[1, np.argmax(mask[1])] = np.nan
    m = paritygate.mismatch(faulty, logp_infer, mask, tier="bf16/bf16")
    assert label in m.labels, m.diagnosis
    assert not m.consistent
    assert m.as_dict()["mismatch/consistent"] == 0.0
    if fault == "nan":
        assert m.nonfinite_tokens == 1 and m.n_tokens == int(mask.sum()) - 1
    if fault == "outlier":
        assert m.catastrophic_token_frac == pytest.approx(1 / int(mask.sum()))
        assert m.is_ratio_frac_low == pytest.approx(1 / int(mask.sum()))


def test_no_compared_token_is_nan_not_zero() -> None:
    logp_infer, _ = _batch()
    m = paritygate.mismatch(logp_infer, logp_infer, np.zeros(logp_infer.shape, bool))
    assert m.n_tokens == 0 and m.labels == ("no tokens",) and not m.consistent
    assert all(math.isnan(v) for k, v in m.as_dict().items()
               if k not in ("mismatch/n_tokens", "mismatch/nonfinite_tokens",
                            "mismatch/consistent"))
    assert m.to_json()["mismatch_k3_kl"] is None


def test_torch_tensors_any_dtype_give_the_numpy_numbers() -> None:
    torch = pytest.importorskip("torch")
    logp_infer, mask = _batch(4)
    logp_train = logp_infer + 0.01
    from_numpy = paritygate.mismatch(logp_train, logp_infer, mask)
    from_torch = paritygate.mismatch(torch.from_numpy(logp_train), torch.from_numpy(logp_infer),
                                     torch.from_numpy(mask))
    assert from_torch == from_numpy
    bf16 = paritygate.mismatch(torch.from_numpy(logp_train).bfloat16(),
                               torch.from_numpy(logp_infer).bfloat16(),
                               torch.from_numpy(mask).int(), tier="bf16/bf16")
    assert bf16.n_tokens == from_numpy.n_tokens
    assert bf16.delta_mean == pytest.approx(0.01, abs=0.02)
    one_row = paritygate.mismatch(torch.from_numpy(logp_train[0]),
                                  torch.from_numpy(logp_infer[0]))
    assert one_row.n_tokens == logp_infer.shape[1]


def test_bad_shapes_and_tier_are_value_errors() -> None:
    logp_infer, mask = _batch()
    with pytest.raises(ValueError, match="shape mismatch"):
        paritygate.mismatch(logp_infer[:, :-1], logp_infer, mask)
    with pytest.raises(ValueError, match="unknown tier 'bf8'"):
        paritygate.mismatch(logp_infer, logp_infer, mask, tier="bf8")


def test_import_paritygate_stays_free_of_torch() -> None:
    code = ("import sys, numpy as np, paritygate; "
            "m = paritygate.mismatch(np.zeros((2, 3)) - 1, np.zeros((2, 3)) - 1); "
            "assert m.consistent; "
            "print(sorted(n for n in ('torch', 'transformers', 'onnxruntime') "
            "if n in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_readme_training_loop_example_runs() -> None:
    pytest.importorskip("torch")
    text = README.read_text(encoding="utf-8")
    section = text.split("## The in-loop mismatch meter", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None and "paritygate.mismatch(" in block.group(1)
    assert len(block.group(1).strip().splitlines()) <= 12
    exec(compile(block.group(1), "docs/training.md", "exec"), {})
