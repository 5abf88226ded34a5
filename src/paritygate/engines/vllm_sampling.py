"""Many samples of each prompt from vLLM, for ``behaviour_parity``: one seeded request per
sample, so the draw reproduces from the seed."""

from __future__ import annotations

import hashlib

import numpy as np

from paritygate.engines.dump_stream import finish_from_vllm
from paritygate.engines.generation import Generation, SamplingSpec
from paritygate.engines.vllm_engine import VLLMEngine, _import_vllm, sampling_params_kwargs
from paritygate.engines.vllm_waves import generate_in_waves


def sample_seed(seed: int | None, prompt: int, sample: int) -> int | None:
    """The seed of sample ``sample`` of prompt ``prompt``: a function of the three only, so
    a draw reproduces whatever the batch, the scheduling or the run."""
    if seed is None:
        return None
    key = f"{seed}:{prompt}:{sample}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:4], "big") & 0x7FFFFFFF


def sample_n(engine: VLLMEngine, prompts: list[list[int]], sampling: SamplingSpec,
             n: int) -> tuple[Generation, list[str]]:
    """``n`` samples of each prompt: a :class:`Generation` of ``len(prompts) * n`` rows (a
    prompt's samples adjacent, no log-probs) and how each ended (``eos``, ``stop``,
    ``length``, from vLLM's ``finish_reason`` and ``stop_reason``: vLLM leaves a stop string
    out of the text, so the tokens cannot tell).

    Each sample is its own request with its own seed (:func:`sample_seed` of the spec's seed,
    the prompt and the sample index), so the draw reproduces from the seed run to run and
    whatever the batch. The requests go in waves vLLM prefills whole
    (:mod:`paritygate.engines.vllm_waves`): vLLM's CPU build cannot rewind a seeded request's
    generator after a partial prefill, and its engine dies ("CPU Generator does not use
    offset")."""
    vllm = _import_vllm()
    params = [vllm.SamplingParams(**{**sampling_params_kwargs(sampling, 0, 0), "n": 1,
                                     "logprobs": None, "seed": sample_seed(sampling.seed, i, k)})
              for i in range(len(prompts)) for k in range(n)]
    requests = [{"prompt_token_ids": [int(t) for t in p]} for p in prompts for _ in range(n)]
    lora = engine.lora_request()
    extra = {"lora_request": lora} if lora is not None else {}
    outputs = generate_in_waves(engine.llm, requests, params, sampling.max_new_tokens, **extra)
    expanded = [p for p in prompts for _ in range(n)]
    rows = [(list(prompt), [int(t) for t in c.token_ids],
             finish_from_vllm(c.finish_reason, c.stop_reason))
            for request, prompt in zip(outputs, expanded, strict=True)
            for c in request.outputs]
    if len(rows) != n * len(prompts):
        raise ValueError(f"vLLM returned {len(rows)} samples for {len(prompts)} prompts x n={n}")
    gen = Generation([p for p, _, _ in rows], [o for _, o, _ in rows], [[] for _ in rows], None,
                     engine.logprobs_mode, engine.name)
    return gen, [r for _, _, r in rows]


def prompt_logprobs(engine: VLLMEngine, prompts: list[list[int]], outputs: list[list[int]],
                    vocab: int) -> list[np.ndarray]:
    """The engine's log-probs over the whole vocabulary at each token of ``outputs[i]``,
    teacher-forced after ``prompts[i]`` (``SamplingParams(prompt_logprobs=-1)`` over
    prompt + output, one token generated and dropped): one ``(len(outputs[i]), vocab)``
    float32 array per row, ``-inf`` where vLLM reported nothing (a token id beyond
    ``vocab`` widens the row, so a wider served vocabulary shows as a shape). vLLM
    computes prompt log-probs from the raw logits (``log_softmax``, no temperature or
    penalty), so they are the served model's distribution whatever the sampling config."""
    vllm = _import_vllm()
    params = vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=-1,
                                 logprobs=None, detokenize=False)
    requests = [{"prompt_token_ids": [int(t) for t in p] + [int(t) for t in o]}
                for p, o in zip(prompts, outputs, strict=True)]
    lora = engine.lora_request()
    extra = {"lora_request": lora} if lora is not None else {}
    results = engine.llm.generate(requests, params, use_tqdm=False, **extra)
    rows: list[np.ndarray] = []
    for request, prompt, output in zip(results, prompts, outputs, strict=True):
        steps = request.prompt_logprobs or []
        width = max([vocab, *(1 + int(t) for step in steps if step for t in step)])
        row = np.full((len(output), width), -np.inf, dtype=np.float32)  # (N, V)
        for j in range(len(output)):
            step = steps[len(prompt) + j] if len(prompt) + j < len(steps) else None
            for token, lp in (step or {}).items():
                row[j, int(token)] = float(lp.logprob)
        rows.append(row)
    return rows
