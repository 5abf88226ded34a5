"""Physical sanity: measured relative errors follow the formats' unit roundoff.

On a seeded random transformer the first block's local relative error must be
a small multiple of u (2^-8 bfloat16, 2^-11 float16), and bf16/fp16 must be
near 2^3 = 8, the ratio of their unit roundoffs. If this disagrees with the
arithmetic, the measurement is wrong.
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaModel

from paritygate.precision.budgets import unit_roundoff
from paritygate.precision.config import PrecisionSpec
from paritygate.precision.measure import measure_model


def test_first_block_error_matches_unit_roundoff() -> None:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    model = LlamaModel(config).eval()
    generator = torch.Generator().manual_seed(0)
    batches = [((), {"input_ids": torch.randint(0, 256, (4, 16), generator=generator)})]
    run = measure_model(
        model, batches, lambda out: out.last_hidden_state, PrecisionSpec(layers="blocks")
    )
    first = next(r for r in run.layers if r.key == "layers.0")
    fp16, bf16 = first.local["float16"].rel_l2, first.local["bfloat16"].rel_l2
    assert 4 <= bf16 / fp16 <= 16, (fp16, bf16)
    for dtype, value in (("float16", fp16), ("bfloat16", bf16)):
        u = unit_roundoff(dtype)
        assert u / 4 <= value <= 4 * u, (dtype, value / u)
    assert not run.errors


def test_local_max_batches_samples_local_error_and_says_so() -> None:
    """Local error on the first batches only; cumulative error on every batch; a note says it."""
    from paritygate.precision.analysis import run_precision
    from paritygate.precision.subject import PrecisionSubject

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    generator = torch.Generator().manual_seed(0)
    batches = [((torch.randn(5, 8, generator=generator),), {}) for _ in range(3)]
    spec = PrecisionSpec(local_max_batches=1)
    run = measure_model(model.eval(), batches, lambda out: out, spec)
    last = next(r for r in run.layers if r.key == "2")
    assert last.local["float16"].n == 5 * 4
    assert last.cum["float16"].n == 3 * 5 * 4
    report = run_precision(PrecisionSubject("s", lambda: model, batches, lambda o: o), spec, 16, 8)
    assert any("first 1 of 3 probe batches" in note for note in report.notes)
    full = run_precision(PrecisionSubject("s", lambda: model, batches, lambda o: o),
                         PrecisionSpec(), 16, 8)
    assert not any("probe batches" in note for note in full.notes)


def test_a_pair_compared_once_serves_every_layer_that_sees_it() -> None:
    """An identity layer's output is its input, and a layer's input the previous output: the
    comparisons shared through one computation equal comparisons made directly."""
    from paritygate.precision.stats import ErrorStats

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.Dropout(0.1), torch.nn.Linear(16, 4)
    ).eval()
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(0))
    run = measure_model(model, [((x,), {})], lambda out: out, PrecisionSpec(layers="leaves"))
    first, dropout, last = (next(r for r in run.layers if r.key == k) for k in ("0", "1", "2"))
    for dtype in ("float16", "bfloat16"):
        assert dropout.cum[dtype].sum_err2 == first.cum[dtype].sum_err2 > 0
        assert last.cum_in[dtype].rel_l2 == first.cum[dtype].rel_l2
        # the first layer's cumulative error, computed directly
        low = getattr(torch, dtype)
        with torch.no_grad():
            direct = ErrorStats()
            direct.update(model[0](x), torch.nn.functional.linear(
                x.to(low), model[0].weight.to(low), model[0].bias.to(low)))  # fmt: skip
        assert first.cum[dtype].rel_l2 == direct.rel_l2


class _Net(torch.nn.Module):
    """fc1 -> relu -> fc2, with the relu in place or not, or an in-place add in the forward."""

    def __init__(self, inplace: bool = False, add: bool = False) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)
        self.act = torch.nn.ReLU(inplace=inplace)
        self.add = add

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        if self.add:
            h.add_(0.0)  # changes nothing, bumps the version counter
        return self.fc2(self.act(h))


def _layer_numbers(model: torch.nn.Module, x: torch.Tensor) -> dict[str, object]:
    run = measure_model(model, [((x,), {})], lambda out: out, PrecisionSpec())
    return {
        r.key: (
            r.act.max_abs,
            {d: (s.sum_err2, s.max_abs) for d, s in r.local.items()},
            {d: (s.sum_err2, s.max_abs) for d, s in r.cum.items()},
            {d: s.sum_err2 for d, s in r.cum_in.items()},
        )
        for r in run.layers
    }


def test_an_output_changed_in_place_later_is_compared_as_it_was_returned() -> None:
    """The fp32 run keeps layer outputs without copying them; a later in-place op (an in-place
    activation, an in-place add in the forward) must not change what the layer is compared
    with: the numbers equal those of the same weights computed out of place."""
    torch.manual_seed(0)
    clean = _Net().eval()
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(0))
    expected = _layer_numbers(clean, x)
    assert expected["fc1"][2]["float16"][0] > 0  # fc1's cumulative error is measured
    for variant in (_Net(inplace=True), _Net(add=True)):
        variant.load_state_dict(clean.state_dict())
        assert _layer_numbers(variant.eval(), x) == expected


def test_local_error_is_the_layer_alone_on_its_fp32_input_with_cast_weights() -> None:
    """A layer's local error equals its own rerun, computed directly: fp32 input cast to the
    dtype, weights cast to the dtype, against its fp32 output."""
    from paritygate.precision.stats import ErrorStats

    torch.manual_seed(0)
    model = _Net().eval()
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(0))
    run = measure_model(model, [((x,), {})], lambda out: out, PrecisionSpec(layers="leaves"))
    fc2 = next(r for r in run.layers if r.key == "fc2")
    with torch.no_grad():
        h = torch.relu(model.fc1(x))
        for dtype in ("float16", "bfloat16"):
            low = getattr(torch, dtype)
            direct = ErrorStats()
            direct.update(model.fc2(h), torch.nn.functional.linear(
                h.to(low), model.fc2.weight.to(low), model.fc2.bias.to(low)))  # fmt: skip
            assert fc2.local[dtype].rel_l2 == direct.rel_l2 > 0
            assert fc2.local[dtype].max_abs == direct.max_abs


def test_a_layer_fed_an_overflowed_input_is_flagged_not_judged() -> None:
    """fc1's fp32 output exceeds fp16's range: fc1 is the first divergent layer; the ReLU after
    it sees that input clipped in its local rerun, so its row says so and is not judged."""
    from paritygate.precision.analysis import run_precision
    from paritygate.precision.subject import PrecisionSubject

    torch.manual_seed(0)
    model = _Net().eval()
    with torch.no_grad():
        model.fc1.weight.mul_(1e5)
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(0))
    subject = PrecisionSubject("t", lambda: model, [((x,), {})], lambda out: out)
    report = run_precision(subject, PrecisionSpec(layers="leaves", suggest_mixed=False), 16.0, 8.0)
    rows = {r.layer: r for r in report.dtype_rows("float16")}
    assert rows["fc1"].over_budget and not rows["fc1"].input_beyond_range
    assert rows["act"].input_beyond_range and not rows["act"].over_budget
    assert rows["act"].local_rel_l2 > 16 * 2.0**-11  # the clipping is there, shown
    summary = report.summary["float16"]
    assert summary.first_divergent is not None and summary.first_divergent.layer == "fc1"
    assert summary.input_beyond_range == ["act", "fc2"]  # fc2 reads the same values
    # bf16 holds fp32's range: nothing is clipped
    assert not any(r.input_beyond_range for r in report.dtype_rows("bfloat16"))
