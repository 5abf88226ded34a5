"""One sampling model across engines: each engine applies the fields of its own API and refuses
the rest by name; ``sampling_config``'s off-policy fields; a penalty's shape in a log-prob
delta."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from paritygate.engines.generation import HF_APPLIES, VLLM_APPLIES, SamplingSpec, refuse_unapplied
from paritygate.engines.vllm_engine import sampling_params_kwargs
from paritygate.errors import InputError
from paritygate.families.causal_lm.sampling import TRAINER_DEFAULTS, load_sampling_file
from paritygate.metrics.logprob_penalty import penalty_signature, repeated_mask


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


def _penalised(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    prompts = [list(rng.integers(0, 50, 6)) for _ in range(16)]
    outputs = [list(rng.integers(0, 50, 12)) for _ in range(16)]
    repeated = repeated_mask(prompts, outputs, 12)
    noise = rng.normal(0, 0.01, (16, 12))
    return repeated, np.ones((16, 12), bool), noise


def test_penalty_shape_is_named() -> None:
    repeated, valid, noise = _penalised(np.random.default_rng(0))
    delta = noise + np.where(repeated, 0.3, -0.05)  # served lowered repeated tokens
    assert penalty_signature(delta, valid, repeated, 1e-3).penalty


def test_noise_and_weights_are_not_a_penalty() -> None:
    rng = np.random.default_rng(1)
    repeated, valid, noise = _penalised(rng)
    assert not penalty_signature(noise, valid, repeated, 1e-3).penalty
    other_weights = rng.normal(0, 0.3, noise.shape)
    assert not penalty_signature(other_weights, valid, repeated, 1e-3).penalty
    # an engine that raises repeated tokens is not a penalty either
    assert not penalty_signature(np.where(repeated, -0.3, 0.02), valid, repeated, 1e-3).penalty
    # nor one that raises every token but one (a minimum length masking EOS)
    assert not penalty_signature(np.full(noise.shape, -0.1), valid, repeated, 1e-3).penalty
    # nor a truncation on one side (min_p): every kept token raised, fresh ones more (measured
    # on the demo's min_p_one_side: repeated -0.011, fresh -0.024 nats, 3.4 standard errors)
    truncated = noise * 0.1 + np.where(repeated, -0.011, -0.024)
    assert not penalty_signature(truncated, valid, repeated, 1e-4).penalty


def test_repeated_mask_counts_prompt_and_earlier_tokens() -> None:
    mask = repeated_mask([[1, 2]], [[3, 1, 3, 4]], 5)
    assert mask.tolist() == [[False, True, True, False, False]]


def test_a_presence_penalty_counts_the_completion_alone() -> None:
    """vLLM's presence penalty lowers tokens repeated within the completion only; tokens that
    repeat the prompt alone are raised like fresh ones, which dilutes the prompt-or-completion
    split below significance: the completion-alone split names it."""
    from paritygate.metrics.logprob_penalty import read_penalty

    rng = np.random.default_rng(3)
    prompts = [list(range(60)) for _ in range(16)]  # every completion token repeats the prompt
    outputs = [list(rng.integers(0, 60, 12)) for _ in range(16)]
    in_completion = repeated_mask([[] for _ in outputs], outputs, 12)
    delta = rng.normal(0, 0.002, (16, 12)) + np.where(in_completion, 0.4, -0.02)
    valid = np.ones((16, 12), bool)
    assert not penalty_signature(delta, valid, repeated_mask(prompts, outputs, 12), 1e-4).penalty
    found = read_penalty(delta, valid, prompts, outputs, 1e-4)
    assert found.penalty and found.seen_in == "completion"
    assert not read_penalty(rng.normal(0, 0.3, (16, 12)), valid, prompts, outputs, 1e-4).penalty


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
