"""In-place casts of a model's weights: undone exactly, and cast once when a cache is given."""

from __future__ import annotations

import torch
from torch import nn

from paritygate.precision.hooks import cast_params


def test_cast_params_undo_and_cache() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2)).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cache: dict[int, torch.Tensor] = {}
    restore = cast_params(model, torch.float16, keep=[model[2]], cache=cache)
    assert model[0].weight.dtype == model[1].running_mean.dtype == torch.float16
    assert model[2].weight.dtype == torch.float32  # kept
    first = model[0].weight.data_ptr()
    restore()
    restore = cast_params(model[0], torch.float16, cache=cache)
    assert model[0].weight.data_ptr() == first  # swapped in from the cache, not cast again
    restore()
    after = model.state_dict()
    assert all(after[k].dtype == v.dtype and torch.equal(after[k], v) for k, v in before.items())
    restore = cast_params(model, torch.bfloat16)  # no cache: a fresh cast each call
    assert model[2].weight.dtype == torch.bfloat16 and not any(
        t.dtype == torch.bfloat16 for t in cache.values()
    )
    restore()


def test_mixed_run_hands_activations_between_kept_layers_in_the_low_dtype() -> None:
    """The mixed-precision verification runs as a runtime with fp32-pinned nodes: kept layers
    compute in fp32 on upcast inputs and hand their outputs on in the low dtype, also to
    another kept layer (never an fp32 hand-off that a runtime would not perform)."""
    from paritygate.precision.hooks import LowPrecision

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
    ).eval()
    kept = [model[0], model[1]]
    seen: dict[str, torch.Tensor] = {}
    with LowPrecision(model, torch.float16, keep=kept), torch.no_grad():
        handles = [
            model[1].register_forward_pre_hook(lambda m, a: seen.__setitem__("in1", a[0])),
            model[0].register_forward_hook(lambda m, a, o: seen.__setitem__("out0", o)),
            model[1].register_forward_hook(lambda m, a, o: seen.__setitem__("out1", o)),
            model[2].register_forward_pre_hook(lambda m, a: seen.__setitem__("in2", a[0])),
        ]
        model(torch.randn(4, 8, dtype=torch.float16))
        for handle in handles:
            handle.remove()
        assert model[0].weight.dtype == torch.float32 and model[2].weight.dtype == torch.float16
    assert seen["out0"].dtype == torch.float16, "a kept layer hands its output on in fp16"
    assert seen["in1"].dtype == torch.float32, "a kept layer computes on upcast inputs"
    assert torch.equal(seen["in1"], seen["in1"].half().float()), "upcast from an fp16 hand-off"
    assert seen["out1"].dtype == torch.float16 and seen["in2"].dtype == torch.float16
