"""The served-weights comparison tells a low-rank update of projection weights (an adapter
merged otherwise) from another checkpoint, by the rank of each difference."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from paritygate.families.causal_lm.weights import (  # noqa: E402
    compare_states,
    difference_rank,
    projection_module,
)


def _state(seed: int = 0) -> dict[str, object]:
    gen = torch.Generator().manual_seed(seed)
    state = {"model.embed_tokens.weight": torch.randn(100, 64, generator=gen),
             "lm_head.weight": torch.randn(100, 64, generator=gen),
             "model.norm.weight": torch.ones(64)}
    for layer in range(2):
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            state[f"model.layers.{layer}.self_attn.{name}.weight"] = torch.randn(
                64, 64, generator=gen) * 0.1
        for name, shape in (("gate_proj", (256, 64)), ("up_proj", (256, 64)),
                            ("down_proj", (64, 256))):
            state[f"model.layers.{layer}.mlp.{name}.weight"] = torch.randn(
                *shape, generator=gen) * 0.1
    return state


def _lora(state: dict[str, object], targets: tuple[str, ...], rank: int, scale: float
          ) -> dict[str, object]:
    """``state`` with ``scale * B @ A`` merged into every target module (fp32 rounding kept)."""
    gen = torch.Generator().manual_seed(7)
    out = dict(state)
    for key, weight in state.items():
        if projection_module(key) in targets:
            rows, cols = weight.shape  # type: ignore[attr-defined]
            b = torch.randn(rows, rank, generator=gen) * 0.05
            a = torch.randn(rank, cols, generator=gen) * 0.1
            out[key] = weight + scale * (b @ a)  # type: ignore[operator]
    return out


def test_projection_modules_are_named_by_their_module() -> None:
    assert projection_module("model.layers.0.self_attn.q_proj.weight") == "q_proj"
    assert projection_module("transformer.h.0.attn.c_attn.weight") == "c_attn"
    for key in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
                "model.layers.0.self_attn.q_proj.bias"):
        assert projection_module(key) is None


def test_difference_rank_of_a_merged_update() -> None:
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(256, 64, generator=gen)
    update = torch.randn(256, 3, generator=gen) @ torch.randn(3, 64, generator=gen) * 1e-2
    assert difference_rank(weight, weight + update) == 3  # fp32 rounding of the sum ignored
    assert difference_rank(weight, weight.clone()) == 0
    noise = torch.randn(256, 64, generator=gen) * 1e-2
    assert difference_rank(weight, weight + noise) is None  # full rank: another checkpoint
    nan = weight.clone()
    nan[0, 0] = float("nan")
    assert difference_rank(weight, nan) is None


@pytest.mark.parametrize("targets", [("q_proj", "v_proj"), ("q_proj", "k_proj", "v_proj",
                                                            "o_proj", "gate_proj", "up_proj",
                                                            "down_proj")])
def test_an_adapter_merged_with_another_scale_is_low_rank(targets: tuple[str, ...]) -> None:
    base = _state()
    training = _lora(base, targets, rank=8, scale=2.0)
    for served in (base, _lora(base, targets, rank=8, scale=4.0)):  # no adapter, other scale
        diff = compare_states(training, served, [])
        assert set(diff.low_rank) == set(diff.value_diffs)
        assert len(diff.low_rank) == 2 * len(targets)
        assert set(diff.low_rank.values()) == {8}


def test_another_checkpoint_is_not_an_adapter() -> None:
    training = _state()
    gen = torch.Generator().manual_seed(5)
    moved = {k: v + torch.randn(v.shape, generator=gen) * 0.01  # type: ignore[attr-defined]
             for k, v in training.items()}
    assert compare_states(training, moved, []).low_rank == {}
    # only the projections moved, but by a full-rank step: still another checkpoint
    step = {k: (moved[k] if projection_module(k) else v) for k, v in training.items()}
    diff = compare_states(training, step, [])
    assert diff.value_diffs and diff.low_rank == {}
    # a low-rank change that reaches the embeddings is not a projection adapter
    embedded = _lora(training, ("q_proj",), rank=4, scale=2.0)
    embedded["model.embed_tokens.weight"] = training["model.embed_tokens.weight"] + 1.0  # type: ignore[operator]
    assert compare_states(training, embedded, []).low_rank == {}
