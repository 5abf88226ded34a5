"""Semantics of the training-side log-prob function (what logprob_impl proves)."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from paritygate.families.causal_lm.logprobs import (  # noqa: E402
    compute_logprobs,
    logprobs_from_logits,
    process_logits,
    target_mask,
)

VOCAB = 100
PAD = 0


@pytest.fixture(scope="module")
def tiny_llama():
    """A tiny random LlamaForCausalLM built from a config (no download)."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=PAD,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = transformers.LlamaForCausalLM(config)
    model.eval()
    return model


def _shifted_by_one(logits, input_ids, attention_mask):
    """A deliberately wrong implementation: position t scores token t (off by one)."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # (B, T-1, V)
    wrong_targets = input_ids[:, :-1]  # (B, T-1): should be input_ids[:, 1:]
    out = logp.gather(-1, wrong_targets.unsqueeze(-1)).squeeze(-1)
    return torch.where(target_mask(attention_mask), out, torch.zeros_like(out))


def _assert_scores_next_token(fn) -> None:
    """Logits that put almost all mass on the *next* token: its log-prob must be ~0."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (3, 9), generator=gen)  # (B, T)
    mask = torch.ones_like(ids)
    logits = torch.randn(3, 9, VOCAB, generator=gen)  # (B, T, V)
    logits[:, :-1].scatter_(-1, ids[:, 1:].unsqueeze(-1), 30.0)  # next token dominates
    out = fn(logits, ids, mask)  # (B, T-1)
    assert out.shape == (3, 8)
    assert torch.all(out > -1e-6), "position t does not score token t+1"


def test_equals_categorical_log_prob() -> None:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (4, 12), generator=gen)  # (B, T)
    mask = torch.ones_like(ids)
    logits = torch.randn(4, 12, VOCAB, generator=gen) * 3.0  # (B, T, V)
    out = logprobs_from_logits(logits, ids, mask)
    expected = torch.distributions.Categorical(logits=logits[:, :-1]).log_prob(ids[:, 1:])
    assert out.dtype == torch.float32
    assert out.shape == (4, 11)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)


def test_position_t_scores_token_t_plus_1() -> None:
    _assert_scores_next_token(logprobs_from_logits)


def test_off_by_one_variant_fails_the_test() -> None:
    with pytest.raises(AssertionError, match="does not score token t\\+1"):
        _assert_scores_next_token(_shifted_by_one)


def test_pads_are_zero_and_excluded() -> None:
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(3, VOCAB, (2, 8), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, 5:] = 0  # right padding
    mask[1, :3] = 0  # left padding
    logits = torch.randn(2, 8, VOCAB, generator=gen)
    out = logprobs_from_logits(logits, ids, mask)
    keep = target_mask(mask)
    assert keep[0].tolist() == [True] * 4 + [False] * 3
    # Left padding: the first real token (index 3) is scored from a pad position -> excluded.
    assert keep[1].tolist() == [False] * 3 + [True] * 4
    assert torch.all(out[~keep] == 0.0)
    assert torch.all(out[keep] < 0.0)
    # Whatever sits in the pad slots (ids or logits, even NaN) cannot leak into the result.
    ids2, logits2 = ids.clone(), logits.clone()
    ids2[0, 5:] = 7
    ids2[1, :3] = 9
    logits2[0, 5:] = float("nan")
    logits2[1, :3] = float("nan")
    torch.testing.assert_close(logprobs_from_logits(logits2, ids2, mask), out, atol=0, rtol=0)


def _left_pad(rows: list[list[int]]) -> tuple:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), PAD, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(r)
        mask[i, width - len(r) :] = 1
    return ids, mask


def _real_logprobs(out, mask, i: int, length: int) -> np.ndarray:
    """The scored log-probs of row i (a left-padded row of `length` real tokens)."""
    return out[i, -(length - 1) :].numpy()


def test_invariant_to_left_padding_amount(tiny_llama) -> None:
    seq = [1, 17, 42, 5, 88, 23, 61, 9]
    ids, mask = _left_pad([seq])
    alone = compute_logprobs(tiny_llama, ids, mask)[0].numpy()  # (T-1,)
    for pads in (1, 4, 9):
        ids_p = torch.cat([torch.full((1, pads), PAD), ids], dim=1)
        mask_p = torch.cat([torch.zeros((1, pads), dtype=torch.long), mask], dim=1)
        padded = compute_logprobs(tiny_llama, ids_p, mask_p)
        np.testing.assert_allclose(_real_logprobs(padded, mask_p, 0, len(seq)), alone, atol=1e-5)
        assert torch.all(padded[0, :pads] == 0.0)


def test_invariant_to_batch_composition(tiny_llama) -> None:
    rows = [[1, 17, 42, 5, 88, 23], [1, 3, 4], [1, 50, 60, 70, 80, 90, 11, 12, 13], [1, 99]]
    singles = [compute_logprobs(tiny_llama, *_left_pad([r]))[0].numpy() for r in rows]
    for order in ([0, 1, 2, 3], [2, 0, 3, 1]):
        ids, mask = _left_pad([rows[i] for i in order])
        out = compute_logprobs(tiny_llama, ids, mask)
        for slot, i in enumerate(order):
            np.testing.assert_allclose(
                _real_logprobs(out, mask, slot, len(rows[i])), singles[i], atol=1e-5
            )


def test_position_ids_from_mask_for_absolute_positions() -> None:
    """With learned absolute positions (GPT-2), left padding shifts positions unless the
    position ids come from the mask: compute_logprobs is invariant, a naive forward is not.
    (RoPE models such as Llama are nearly shift-invariant, so they cannot show the fault.)"""
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=VOCAB,
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=64,
        pad_token_id=PAD,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    seq = [1, 17, 42, 5, 88, 23, 61, 9]
    ids, mask = _left_pad([seq])
    alone = compute_logprobs(model, ids, mask)[0].numpy()
    ids_p = torch.cat([torch.full((1, 6), PAD), ids], dim=1)
    mask_p = torch.cat([torch.zeros((1, 6), dtype=torch.long), mask], dim=1)
    ours = compute_logprobs(model, ids_p, mask_p)[0, -(len(seq) - 1) :].numpy()
    np.testing.assert_allclose(ours, alone, atol=1e-5)
    with torch.inference_mode():
        logits = model(input_ids=ids_p, attention_mask=mask_p).logits  # default positions
    naive = logprobs_from_logits(logits, ids_p, mask_p)[0, -(len(seq) - 1) :].numpy()
    assert np.max(np.abs(naive - alone)) > 1e-3


def test_compute_logprobs_restores_training_mode_and_returns_float32(tiny_llama) -> None:
    ids, mask = _left_pad([[1, 5, 6, 7]])
    tiny_llama.train()
    try:
        out = compute_logprobs(tiny_llama, ids, mask)
        assert tiny_llama.training
    finally:
        tiny_llama.eval()
    assert out.dtype == torch.float32 and out.shape == (1, 3)
    expected = compute_logprobs(tiny_llama, ids, mask)
    torch.testing.assert_close(out, expected, atol=0, rtol=0)  # dropout was off


def test_processed_matches_hand_computation() -> None:
    z = [2.0, 1.0, 0.5, 3.0, -1.0, 0.0, 1.5, -2.0]  # one row of logits, V = 8
    temperature, top_k = 0.7, 5
    scaled = [v / temperature for v in z]
    kept = sorted(range(8), key=lambda j: -scaled[j])[:top_k]  # tokens 3, 0, 6, 1, 2
    lse = math.log(sum(math.exp(scaled[j]) for j in kept))
    logits = torch.tensor(z).repeat(1, 9, 1)  # (1, T=9, V=8): every position has these logits
    ids = torch.tensor([[3, 0, 3, 6, 1, 2, 4, 5, 7]])  # targets 0,3,6,1,2 kept; 4,5,7 dropped
    mask = torch.ones_like(ids)
    out = logprobs_from_logits(
        logits, ids, mask, temperature=temperature, top_k=top_k, mode="processed"
    )[0]
    for t in range(8):
        target = int(ids[0, t + 1])
        if target in kept:
            assert out[t].item() == pytest.approx(scaled[target] - lse, abs=1e-6)
        else:
            assert out[t].item() == float("-inf")
    raw = logprobs_from_logits(logits, ids, mask, temperature=temperature, top_k=top_k)[0]
    lse_raw = math.log(sum(math.exp(v) for v in z))
    assert raw[0].item() == pytest.approx(z[0] - lse_raw, abs=1e-6)  # raw ignores processing


def test_processed_top_p_hand_computation() -> None:
    z = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))  # probabilities at temperature 1
    # top_p 0.75: 0.5 alone is < 0.75, 0.5 + 0.3 >= 0.75 -> keep tokens 0 and 1.
    out = process_logits(z, top_p=0.75)
    assert torch.isinf(out[2:]).all() and torch.isfinite(out[:2]).all()
    logp = torch.log_softmax(out, dim=-1)
    assert logp[0].item() == pytest.approx(math.log(0.5 / 0.8), abs=1e-6)
    # top_p 0.5 keeps only the top token (cumulative 0.5 reaches it exactly).
    assert torch.isfinite(process_logits(z, top_p=0.5)).sum().item() == 1


def test_processing_matches_transformers_warpers() -> None:
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    gen = torch.Generator().manual_seed(3)
    scores = torch.randn(6, VOCAB, generator=gen) * 2.0  # (N, V)
    ids = torch.zeros((6, 1), dtype=torch.long)
    expected = scores
    for warper in (TemperatureLogitsWarper(0.7), TopKLogitsWarper(20), TopPLogitsWarper(0.9)):
        expected = warper(ids, expected)
    ours = process_logits(scores, temperature=0.7, top_k=20, top_p=0.9)
    assert torch.equal(torch.isinf(ours), torch.isinf(expected))
    finite = torch.isfinite(ours)
    torch.testing.assert_close(ours[finite], expected[finite], atol=1e-6, rtol=0)


def test_bad_arguments_are_rejected() -> None:
    logits = torch.zeros(1, 3, 5)
    ids = torch.zeros(1, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="temperature"):
        logprobs_from_logits(logits, ids, torch.ones_like(ids), temperature=0.0, mode="processed")
    with pytest.raises(ValueError, match="mode"):
        logprobs_from_logits(logits, ids, torch.ones_like(ids), mode="final")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"\(B, T, V\)"):
        logprobs_from_logits(logits[:, :2], ids, torch.ones_like(ids))
