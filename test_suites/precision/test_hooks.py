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
