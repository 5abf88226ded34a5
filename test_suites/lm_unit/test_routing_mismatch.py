"""``paritygate.routing_mismatch`` and the per-layer routing comparison: hand-made expert ids
and router logits with known answers."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import paritygate
from paritygate.metrics.routing import compare_layer, merge_layers, tie_tolerance


def test_identical_routing_is_zero_mismatch() -> None:
    ids = np.array([[[0, 1], [2, 3]], [[4, 5], [6, 7]]])  # (T=2, L=2, K=2)
    out = paritygate.routing_mismatch(ids, ids[..., ::-1])  # order within k does not matter
    assert out.routing_mismatch_frac == 0.0 and out.expert_overlap == 1.0
    assert out.n_tokens == 2 and out.n_layers == 2 and out.top_k == 2


def test_one_flipped_layer_of_one_token() -> None:
    train = np.array([[[[0, 1], [2, 3]], [[4, 5], [6, 7]]]])  # (B=1, T=2, L=2, K=2)
    infer = train.copy()
    infer[0, 1, 0] = [4, 6]  # token 1, layer 0: one expert of two differs
    out = paritygate.routing_mismatch(train, infer)
    assert out.routing_mismatch_frac == pytest.approx(0.25)
    assert out.token_mismatch_frac == pytest.approx(0.5)
    assert out.expert_overlap == pytest.approx(1 - 0.5 / 4)
    assert out.layer_mismatch_frac == (0.5, 0.0)
    assert out.as_dict()["routing/layer_0_mismatch_frac"] == 0.5
    masked = paritygate.routing_mismatch(train, infer, mask=np.array([[1, 0]]))
    assert masked.n_tokens == 1 and masked.routing_mismatch_frac == 0.0


def test_torch_inputs_and_bad_shapes() -> None:
    torch = pytest.importorskip("torch")
    ids = torch.tensor([[[0, 1]], [[1, 2]]])
    assert paritygate.routing_mismatch(ids, ids).routing_mismatch_frac == 0.0
    with pytest.raises(ValueError, match="one shape"):
        paritygate.routing_mismatch(ids, ids[..., :1])
    empty = paritygate.routing_mismatch(ids, ids, mask=[0, 0])
    assert empty.n_tokens == 0 and np.isnan(empty.routing_mismatch_frac)


def test_import_stays_torch_free() -> None:
    code = ("import sys, paritygate; paritygate.routing_mismatch([[[0, 1]]], [[[1, 0]]]); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_flips_at_near_ties_are_told_apart() -> None:
    # 4 experts, top-1: token 0 has a clear margin, token 1 a near tie.
    train_logits = np.array([[3.0, 0.0, -1.0, -2.0], [1.0, 0.99999, -1.0, -2.0]])
    serve = {"logits": None, "experts": np.array([[1], [1]]), "weights": None}
    train = {"logits": train_logits, "experts": np.array([[0], [0]]), "weights": None}
    row = compare_layer("gate", train, serve, tie_tolerance("fp32/fp32"))
    assert row.flip_frac == 1.0
    assert row.flip_near_tie_frac == pytest.approx(0.5)
    assert row.flip_beyond_tie_frac == pytest.approx(0.5)
    assert row.load_training == (1.0, 0.0, 0.0, 0.0)
    assert tie_tolerance("fp32/bf16") > tie_tolerance("fp32/fp16") > tie_tolerance("fp32/fp32")


def test_batches_merge_to_the_whole() -> None:
    """compare_layer over batches, merged, equals compare_layer over every token."""
    rng = np.random.default_rng(0)
    n, experts, k = 300, 8, 2
    logits = rng.normal(size=(n, experts))
    ids = np.argsort(-logits, axis=-1)[:, :k]
    weights = np.take_along_axis(np.exp(logits), ids, -1)
    served = ids.copy()
    served[::7, 0] = (served[::7, 0] + 3) % experts  # some tokens routed elsewhere
    s_weights = weights + rng.normal(scale=1e-3, size=weights.shape)
    s_logits = logits + rng.normal(scale=1e-3, size=logits.shape)

    def side(lg: np.ndarray, e: np.ndarray, w: np.ndarray, sl: slice) -> dict[str, object]:
        return {"logits": lg[sl], "experts": e[sl], "weights": w[sl]}

    whole = compare_layer("l0", side(logits, ids, weights, slice(None)),
                          side(s_logits, served, s_weights, slice(None)), 1e-2)
    cuts = [slice(0, 64), slice(64, 65), slice(65, 200), slice(200, n)]
    merged = merge_layers([compare_layer("l0", side(logits, ids, weights, c),
                                         side(s_logits, served, s_weights, c), 1e-2)
                           for c in cuts])
    for field, value in whole.as_dict().items():
        got = getattr(merged, field)
        if isinstance(value, str):
            assert got == value
        else:
            assert got == pytest.approx(value, rel=1e-12, abs=1e-15), field
    with pytest.raises(ValueError, match="no batch"):
        merge_layers([])
