"""One sampling model across engines: each engine applies the fields of its own API and refuses
the rest by name; ``sampling_config``'s off-policy fields; a penalty's shape in a log-prob
delta."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from paritygate.engines.generation import HF_APPLIES, VLLM_APPLIES, SamplingSpec, refuse_unapplied
from paritygate.engines.vllm_engine import sampling_params_kwargs
from paritygate.errors import InputError
from paritygate.families.causal_lm.sampling import TRAINER_DEFAULTS, load_sampling_file


def _load(tmp_path: Path, text: str, name: str = "s.yaml", trainer: bool = False) -> SamplingSpec:
    path = tmp_path / name
    path.write_text(text)
    side = load_sampling_file(path, trainer=trainer, side_defaults={})
    return side.spec()


@pytest.mark.parametrize("field,value", [("presence_penalty", 1.5), ("frequency_penalty", 0.5),
                                         ("ignore_eos", True)])
def test_hf_refuses_what_it_cannot_apply(field: str, value: object) -> None:
    spec = SamplingSpec(**{field: value})  # type: ignore[arg-type]
    with pytest.raises(InputError) as err:
        refuse_unapplied(spec, "hf", HF_APPLIES)
    assert err.value.key == f"sampling {field}" and "engine hf does not apply" in err.value.cause
    refuse_unapplied(spec, "vllm", VLLM_APPLIES)  # vLLM applies it


def test_presence_penalty_reaches_vllm(tmp_path: Path) -> None:
    spec = _load(tmp_path, "presence_penalty: 1.5\nfrequency_penalty: 0.25\nmax_tokens: 8\n"
                 "stop_token_ids: [9]\nlogit_bias: {5: -2.0}\n")
    kwargs = sampling_params_kwargs(spec)
    assert kwargs["presence_penalty"] == 1.5 and kwargs["frequency_penalty"] == 0.25
    assert kwargs["stop_token_ids"] == [9] and kwargs["logit_bias"] == {5: -2.0}


def test_hf_only_fields_are_refused_on_vllm(tmp_path: Path) -> None:
    spec = _load(tmp_path, '{"transformers_version": "4.50", "no_repeat_ngram_size": 3}',
                 "generation_config.json")
    assert spec.transforms == {"no_repeat_ngram_size": 3}
    with pytest.raises(InputError, match="engine vllm does not apply no_repeat_ngram_size"):
        sampling_params_kwargs(spec)
    refuse_unapplied(spec, "hf", HF_APPLIES)


def test_neutral_values_are_no_transform(tmp_path: Path) -> None:
    spec = _load(tmp_path, "presence_penalty: 0\nlogit_bias: {}\nmax_tokens: 8\n")
    refuse_unapplied(spec, "hf", HF_APPLIES)
    assert spec.transforms == {}


def test_off_policy_fields_of_a_side(tmp_path: Path) -> None:
    path = tmp_path / "train.yaml"
    path.write_text("repetition_penalty: 1.3\nmin_new_tokens: 2\ntemperature: 0.9\n")
    side = load_sampling_file(path, trainer=True, side_defaults={})
    assert side.off_policy() == {"repetition_penalty": 1.3, "min_new_tokens": 2}
    assert TRAINER_DEFAULTS["repetition_penalty"] == 1.0


def test_verl_response_length_is_max_new_tokens(tmp_path: Path) -> None:
    spec = _load(tmp_path, "temperature: 1.0\ntop_k: -1\nn: 4\nresponse_length: 24\n",
                 trainer=True)
    assert spec.max_new_tokens == 24


def _engine_logprobs(logits: np.ndarray, prompt: list[int], output: list[int], *,
                     repetition: float = 1.0, presence: float = 0.0, frequency: float = 0.0,
                     temperature: float = 1.0) -> np.ndarray:
    """vLLM's sampler written out per step: repetition on prompt + completion so far, then
    frequency and presence on the completion so far, then the temperature."""
    out = []
    for j, token in enumerate(output):
        z = logits[j].astype(np.float64).copy()
        seen = np.zeros(z.size, bool)
        seen[list(prompt) + output[:j]] = True
        counts = np.bincount(np.asarray(output[:j], np.int64), minlength=z.size)
        z = np.where(seen, np.where(z > 0, z / repetition, z * repetition), z)
        z = z - frequency * counts - presence * (counts > 0)
        z = z / temperature
        out.append(z[token] - np.log(np.exp(z - z.max()).sum()) - z.max())
    return np.array(out)


def _trainer_sample(seed: int, vocab: int = 40, rows: int = 12, length: int = 16
                    ) -> tuple[list[np.ndarray], list[list[int]], list[list[int]]]:
    """Logits over a small vocabulary with a repetitive completion (tokens drawn from a few)."""
    rng = np.random.default_rng(seed)
    logits = [rng.normal(0, 2.0, (length + 1, vocab)) for _ in range(rows)]
    prompts = [list(rng.integers(0, vocab, 5)) for _ in range(rows)]
    outputs = [list(rng.integers(0, 12, length)) for _ in range(rows)]
    return logits, prompts, outputs


def _fit(logits: list[np.ndarray], prompts: list[list[int]], outputs: list[list[int]],
         engine: list[np.ndarray], applied: dict[str, float] | None = None,
         trainer: list[np.ndarray] | None = None, temperature: float = 1.0) -> Any:
    from paritygate.metrics.logprob_penalty import fit_penalty, seen_tokens

    trainer = trainer or [_engine_logprobs(z, p, o, temperature=temperature, **{
        k.split("_")[0]: v for k, v in (applied or {}).items()})
        for z, p, o in zip(logits, prompts, outputs, strict=True)]
    valid = np.ones((len(outputs), len(outputs[0])), bool)
    delta = np.concatenate([t - e for t, e in zip(trainer, engine, strict=True)])
    seen = seen_tokens(logits, prompts, outputs, valid, temperature)
    return fit_penalty(seen, delta, applied)


@pytest.mark.parametrize("kind,value", [("presence", 1.5), ("frequency", 0.7),
                                        ("repetition", 1.3), ("presence", 0.3)])
def test_the_penalty_that_predicts_the_delta_is_named(kind: str, value: float) -> None:
    """A penalty the engine applies, whatever its strength (presence 1.5 decorrelates the two
    sides, which a sign split over repeated tokens read as noise): the fitted penalty predicts
    the engine's log-probs and the residual collapses."""
    logits, prompts, outputs = _trainer_sample(0)
    engine = [_engine_logprobs(z, p, o, temperature=0.8, **{kind: value})
              for z, p, o in zip(logits, prompts, outputs, strict=True)]
    found = _fit(logits, prompts, outputs, engine, temperature=0.8)
    assert found.penalty and found.kind == f"{kind}_penalty", found
    assert found.strength == pytest.approx(value, rel=1e-3)
    assert found.explained > 0.999 and found.residual_rms < 1e-3 * found.delta_rms


def test_a_declared_penalty_is_the_base() -> None:
    """The trainer applies presence 1.5 (declared): no delta, no penalty; the engine at 2.0
    while the trainer applies 1.5 is named with strength 2.0 over a base of 1.5."""
    logits, prompts, outputs = _trainer_sample(1)
    same = [_engine_logprobs(z, p, o, presence=1.5)
            for z, p, o in zip(logits, prompts, outputs, strict=True)]
    applied = {"presence_penalty": 1.5}
    agreed = _fit(logits, prompts, outputs, same, applied)
    assert not agreed.penalty
    more = [_engine_logprobs(z, p, o, presence=2.0)
            for z, p, o in zip(logits, prompts, outputs, strict=True)]
    found = _fit(logits, prompts, outputs, more, applied)
    assert found.penalty and found.strength == pytest.approx(2.0, rel=1e-3) and found.base == 1.5


def test_other_weights_noise_and_truncation_are_not_a_penalty() -> None:
    """Other weights (the engine's logits moved by noise), precision noise and a truncation on
    the engine side (min_p: kept tokens raised, repeated ones too) are predicted by no penalty
    strength: most of the delta stays."""
    logits, prompts, outputs = _trainer_sample(2)
    rng = np.random.default_rng(5)
    stale = [_engine_logprobs(z + rng.normal(0, 0.5, z.shape), p, o)
             for z, p, o in zip(logits, prompts, outputs, strict=True)]
    assert not _fit(logits, prompts, outputs, stale).penalty
    clean = [_engine_logprobs(z, p, o) for z, p, o in zip(logits, prompts, outputs, strict=True)]
    noisy = [c + rng.normal(0, 1e-6, c.shape) for c in clean]
    assert not _fit(logits, prompts, outputs, noisy).penalty

    def min_p(z: np.ndarray) -> np.ndarray:
        prob = np.exp(z - z.max(-1, keepdims=True))
        return np.where(prob >= 0.05 * prob.max(-1, keepdims=True), z, -1e9)

    truncated = [_engine_logprobs(min_p(z), p, o)
                 for z, p, o in zip(logits, prompts, outputs, strict=True)]
    assert not _fit(logits, prompts, outputs, truncated).penalty


def test_hf_repetition_penalty_leaves_a_rows_pads_out() -> None:
    """HF's repetition penalty reads every token before the step, a left-padded row's pads too
    (transformers 5.19 penalised the pad id: the declared-penalty twin's delta was biased by
    -2.2e-6 nats, beyond the fp32/fp32 mean bound): the engine's own processor reads each
    row's tokens only, with HF's arithmetic."""
    import torch

    from paritygate.engines.hf_generate import _repetition_penalty

    ids = torch.tensor([[0, 0, 3, 1], [2, 0, 3, 1]])  # row 0: two left pads (id 0)
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    scores = torch.tensor([[2.0, 2.0, -1.0, 2.0, 1.0]] * 2)
    out = _repetition_penalty(1.3, mask)(ids, scores.clone())
    expected = torch.tensor([[2.0, 2.0 / 1.3, -1.0, 2.0 / 1.3, 1.0],  # the pad id untouched
                             [2.0 / 1.3, 2.0 / 1.3, -1.3, 2.0 / 1.3, 1.0]])  # a real 0 seen
    assert torch.equal(out, expected)


def test_vllm_applies_the_stated_non_default_fields(tmp_path: Path) -> None:
    """vLLM takes a generation_config.json's stated temperature, top-k, top-p, min-p,
    penalties and max_new_tokens as its defaults; do_sample, min_new_tokens and stop strings
    it ignores, and a field left out takes vLLM's default, not HF's."""
    from paritygate.families.causal_lm.engine_sampling import applied_by

    path = tmp_path / "generation_config.json"
    path.write_text('{"transformers_version": "5.19.0", "temperature": 0.7, "do_sample": false,'
                    ' "min_new_tokens": 3, "stop_strings": ["."], "max_new_tokens": 24}')
    side = load_sampling_file(path, trainer=False, side_defaults={})
    assert side.values["top_k"] == 50 and not side.values["do_sample"]  # HF's reading
    vllm = applied_by("vllm", side)
    assert vllm.values["temperature"] == 0.7 and vllm.values["max_new_tokens"] == 24
    assert vllm.values["top_k"] == 0 and vllm.values["do_sample"]
    assert vllm.values["min_new_tokens"] == 0 and vllm.values["stop"] == []
    assert "vLLM's default" in vllm.source("top_k")
    assert applied_by("hf", side) is side and applied_by("endpoint", side).values == vllm.values


def test_hf_generation_defaults_are_the_installed_transformers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The table of ``GenerationConfig`` defaults (read without importing transformers) holds
    the installed transformers' real defaults; another major version takes its own row."""
    import importlib.metadata

    from transformers import GenerationConfig

    from paritygate.families.causal_lm import engine_sampling as es

    real = GenerationConfig()
    es._hf_defaults.cache_clear()
    try:
        assert es._hf_defaults() == {n: getattr(real, n, None) for n in es.VLLM_TAKES}
        for major, row in es.HF_GENERATION_DEFAULTS.items():
            es._hf_defaults.cache_clear()
            monkeypatch.setattr(importlib.metadata, "version", lambda _n, m=major: f"{m}.1.0")
            assert es._hf_defaults() == row
    finally:
        es._hf_defaults.cache_clear()
