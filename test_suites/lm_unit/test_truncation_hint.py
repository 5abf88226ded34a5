"""logprob_delta's hint names a top-k / top-p renormalisation the trainer may not apply."""

from types import SimpleNamespace

from paritygate.checks.logprob_delta import _truncation_hint


def test_hf_default_top_k_is_named_in_processed_mode() -> None:
    hint = _truncation_hint("processed", "processed", SimpleNamespace(top_k=50, top_p=1.0))
    assert "top_k 50" in hint and "HF's default" in hint
    assert "causal_lm.training.logprob_fn" in hint


def test_top_p_is_named() -> None:
    hint = _truncation_hint("processed", "processed", SimpleNamespace(top_k=0, top_p=0.9))
    assert "top_p 0.9" in hint and "top_k" not in hint.split("renormalised under")[1][:12]


def test_no_truncation_or_raw_mode_says_nothing() -> None:
    assert _truncation_hint("processed", "processed", SimpleNamespace(top_k=0, top_p=1.0)) == ""
    assert _truncation_hint("raw", "raw", SimpleNamespace(top_k=50, top_p=0.9)) == ""
