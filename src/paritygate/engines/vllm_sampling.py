"""Many samples of each prompt from vLLM, for ``behaviour_parity``: one request per prompt
with ``n`` samples (vLLM's own way to draw several completions of one prompt)."""

from __future__ import annotations

from paritygate.engines.dump_stream import finish_from_vllm
from paritygate.engines.generation import Generation, SamplingSpec
from paritygate.engines.vllm_engine import VLLMEngine, _import_vllm, sampling_params_kwargs


def sample_n(engine: VLLMEngine, prompts: list[list[int]], sampling: SamplingSpec,
             n: int) -> tuple[Generation, list[str]]:
    """``n`` samples of each prompt, one request per prompt: a :class:`Generation` of
    ``len(prompts) * n`` rows (a prompt's samples adjacent, no log-probs) and how each ended
    (``eos``, ``stop``, ``length``, from vLLM's ``finish_reason`` and ``stop_reason``: vLLM
    leaves a stop string out of the text, so the tokens cannot tell).

    The samples draw from the engine's generator, seeded once (``vllm.LLM(seed=)``), not
    from a seed per request: vLLM's CPU build cannot rewind a request's own generator when
    it forks ``n`` samples ("CPU Generator does not use offset")."""
    vllm = _import_vllm()
    params = [vllm.SamplingParams(**{**sampling_params_kwargs(sampling, 0, i), "n": n,
                                     "logprobs": None, "seed": None})
              for i in range(len(prompts))]
    requests = [{"prompt_token_ids": [int(t) for t in p]} for p in prompts]
    lora = engine.lora_request()
    extra = {"lora_request": lora} if lora is not None else {}
    outputs = engine.llm.generate(requests, params, use_tqdm=False, **extra)
    rows = [(list(prompt), [int(t) for t in c.token_ids],
             finish_from_vllm(c.finish_reason, c.stop_reason))
            for request, prompt in zip(outputs, prompts, strict=True)
            for c in request.outputs]
    if len(rows) != n * len(prompts):
        raise ValueError(f"vLLM returned {len(rows)} samples for {len(prompts)} prompts x n={n}")
    gen = Generation([p for p, _, _ in rows], [o for _, o, _ in rows], [[] for _ in rows], None,
                     engine.logprobs_mode, engine.name)
    return gen, [r for _, _, r in rows]
