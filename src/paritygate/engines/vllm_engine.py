"""vLLM as a :class:`~paritygate.engines.base.GenerationEngine` (GPU only).

vLLM is imported lazily; without it :class:`VLLMEngine` raises
:class:`~paritygate.errors.MissingExtra`, and :func:`vllm_unavailable_reason`
tells tests and the ``vllm_delta`` check why they skip.

API used (a vLLM release with ``logprobs_mode``, vllm-project/vllm PR #21398,
whose ``processed_*`` values are taken after temperature and top-k/top-p,
PR #22387; both merged in 2025):

- ``vllm.LLM(model=, tokenizer=, dtype=, seed=, enforce_eager=, logprobs_mode=, ...)``;
  the extra keywords go to ``EngineArgs``. ``logprobs_mode`` is a model-config
  field, one of ``raw_logprobs`` (default: log-softmax of the model's logits
  before any logits processor), ``processed_logprobs`` (after all processors,
  including temperature and top-k/top-p), ``raw_logits``, ``processed_logits``;
  only the two log-prob modes are accepted here.
- ``dtype="auto"`` would serve an fp32 checkpoint in fp16, so the dtype is
  always passed explicitly (default ``float32``).
- ``vllm.SamplingParams(n, temperature, top_p, top_k, repetition_penalty,
  max_tokens, min_tokens, stop, seed, logprobs)``: temperature 0 is greedy;
  ``top_k=-1`` disables top-k; ``logprobs=k`` returns the sampled token's
  log-prob plus the top k.
- ``LLM.generate([{"prompt_token_ids": ids}, ...], params, use_tqdm=False)``
  returns one ``RequestOutput`` per prompt, in prompt order; each has
  ``prompt_token_ids`` and ``outputs[0]`` (a ``CompletionOutput``) with
  ``token_ids`` and ``logprobs``: one ``{token_id: Logprob(logprob, rank,
  decoded_token)}`` per generated token.

vLLM's sampler order (vllm/v1/sample/sampler.py): raw log-probs are taken
first; then allowed/bad words, min-tokens, logit bias, penalties, temperature,
min-p, top-k/top-p. So ``processed_logprobs`` also reflect repetition penalty,
min-p and min-tokens EOS masking, which the trainer's
:func:`~paritygate.families.causal_lm.logprobs.compute_logprobs` does not model: compare
processed log-probs only with those set to neutral.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from paritygate.engines.generation import Generation, SamplingSpec
from paritygate.errors import MissingExtra

VLLM_LOGPROBS_MODES: dict[str, str] = {"raw": "raw_logprobs", "processed": "processed_logprobs"}
"""Our log-prob semantics -> vLLM's ``logprobs_mode`` value."""

_MODE_FROM_VLLM = {v: k for k, v in VLLM_LOGPROBS_MODES.items()}


def vllm_unavailable_reason() -> str | None:
    """Why the vLLM engine cannot run here (no CUDA device, vLLM missing), or ``None``."""
    reasons: list[str] = []
    try:
        import torch

        if not torch.cuda.is_available():
            reasons.append("no CUDA device (torch.cuda.is_available() is False)")
    except ImportError:
        reasons.append("torch is not installed")
    if importlib.util.find_spec("vllm") is None:
        reasons.append("vllm is not installed (pip install 'paritygate[vllm]')")
    elif not reasons:
        try:
            importlib.import_module("vllm")
        except Exception as exc:  # a broken install fails in many ways; report it verbatim
            reasons.append(f"vllm does not import: {type(exc).__name__}: {exc}")
    return "; ".join(reasons) or None


def _import_vllm() -> Any:
    if importlib.util.find_spec("vllm") is None:
        raise MissingExtra("vllm", "vllm")
    return importlib.import_module("vllm")


def normalize_logprobs_mode(mode: str) -> str:
    """``raw``/``processed``, or vLLM's ``raw_logprobs``/``processed_logprobs``, to ours."""
    if mode in VLLM_LOGPROBS_MODES:
        return mode
    if mode in _MODE_FROM_VLLM:
        return _MODE_FROM_VLLM[mode]
    raise ValueError(
        f"logprobs_mode {mode!r} is not a log-prob mode; use 'raw' (vLLM raw_logprobs) "
        "or 'processed' (vLLM processed_logprobs)"
    )


def sampling_params_kwargs(sampling: SamplingSpec, num_logprobs: int = 0) -> dict[str, Any]:
    """Keyword arguments for ``vllm.SamplingParams`` that implement ``sampling``.

    ``do_sample=False`` becomes ``temperature=0`` (vLLM's greedy); ``top_k=0``
    becomes ``-1`` (off, accepted by every vLLM version); ``num_logprobs`` is
    the number of top log-probs returned besides the sampled token's.
    """
    return {
        "n": 1,
        "temperature": float(sampling.temperature) if sampling.do_sample else 0.0,
        "top_p": float(sampling.top_p),
        "top_k": int(sampling.top_k) if sampling.top_k > 0 else -1,
        "repetition_penalty": float(sampling.repetition_penalty),
        "max_tokens": int(sampling.max_new_tokens),
        "min_tokens": int(sampling.min_new_tokens),
        "stop": list(sampling.stop) or None,
        "seed": sampling.seed,
        "logprobs": max(0, int(num_logprobs)),
    }


def generation_from_outputs(
    outputs: Sequence[Any],
    prompts: Sequence[Sequence[int]],
    *,
    logprobs_mode: str,
    top_logprobs: bool = False,
    engine: str = "vllm",
) -> Generation:
    """Map vLLM ``RequestOutput`` objects (one per prompt, in order) to a :class:`Generation`.

    Reads ``outputs[i].outputs[0].token_ids`` and, per generated token,
    ``outputs[i].outputs[0].logprobs[j][token_id].logprob``. Raises
    ``ValueError`` when an output does not belong to its prompt, carries no
    log-probs, or lacks the sampled token's log-prob: a comparison must never
    run on misaligned data.
    """
    mode = normalize_logprobs_mode(logprobs_mode)
    if len(outputs) != len(prompts):
        raise ValueError(f"vLLM returned {len(outputs)} outputs for {len(prompts)} prompts")
    prompt_ids: list[list[int]] = []
    output_ids: list[list[int]] = []
    logprobs: list[list[float]] = []
    tops: list[list[dict[int, float]]] = []
    for i, (request, prompt) in enumerate(zip(outputs, prompts, strict=True)):
        reported = getattr(request, "prompt_token_ids", None)
        if reported is not None and list(reported) != list(prompt):
            raise ValueError(f"vLLM output {i} is for another prompt (prompt_token_ids differ)")
        if not request.outputs:
            raise ValueError(f"vLLM output {i} has no completion")
        completion = request.outputs[0]
        ids = [int(t) for t in completion.token_ids]
        steps = completion.logprobs
        if steps is None:
            raise ValueError(
                f"vLLM output {i} has no logprobs (SamplingParams.logprobs was not set)"
            )
        if len(steps) != len(ids):
            raise ValueError(
                f"vLLM output {i}: {len(steps)} logprob entries for {len(ids)} generated tokens"
            )
        row: list[float] = []
        row_top: list[dict[int, float]] = []
        for j, token in enumerate(ids):
            step = steps[j]
            if step is None or token not in step:
                raise ValueError(f"vLLM output {i}, token {j}: no log-prob for sampled id {token}")
            row.append(float(step[token].logprob))
            row_top.append({int(t): float(lp.logprob) for t, lp in step.items()})
        prompt_ids.append([int(t) for t in prompt])
        output_ids.append(ids)
        logprobs.append(row)
        tops.append(row_top)
    return Generation(
        prompt_ids=prompt_ids,
        output_ids=output_ids,
        logprobs=logprobs,
        top_logprobs=tops if top_logprobs else None,
        logprobs_mode=mode,
        engine=engine,
    )


class VLLMEngine:
    """Generate with vLLM's offline ``LLM`` and report per-token log-probs.

    ``logprobs_mode`` is ``"raw"`` (vLLM ``raw_logprobs``, compare with
    ``compute_logprobs(mode="raw")``) or ``"processed"`` (``processed_logprobs``,
    compare with ``mode="processed"`` and the same temperature/top-k/top-p).
    The engine is built on first use; :meth:`close` frees the GPU memory.
    """

    name = "vllm"

    def __init__(
        self,
        model_dir: str | Path,
        *,
        tokenizer_dir: str | Path | None = None,
        dtype: str = "float32",
        seed: int = 0,
        enforce_eager: bool = True,
        logprobs_mode: str = "raw",
        top_logprobs: int = 0,
        gpu_memory_utilization: float = 0.3,
        max_model_len: int | None = None,
        engine_kwargs: Mapping[str, Any] | None = None,
        tensor_parallel_size: int = 1,
    ) -> None:
        self.model_dir = str(model_dir)
        self.tokenizer_dir = str(tokenizer_dir) if tokenizer_dir is not None else self.model_dir
        self.dtype = dtype
        self.seed = seed
        self.enforce_eager = enforce_eager
        self.logprobs_mode = normalize_logprobs_mode(logprobs_mode)
        self.top_logprobs = max(0, int(top_logprobs))
        self.gpu_memory_utilization = gpu_memory_utilization
        self.max_model_len = max_model_len
        self.tensor_parallel_size = int(tensor_parallel_size)
        self.engine_kwargs = dict(engine_kwargs or {})
        self._llm: Any = None

    @property
    def vllm_logprobs_mode(self) -> str:
        """The value passed to vLLM: ``raw_logprobs`` or ``processed_logprobs``."""
        return VLLM_LOGPROBS_MODES[self.logprobs_mode]

    def llm_kwargs(self) -> dict[str, Any]:
        """Everything passed to ``vllm.LLM``."""
        kwargs: dict[str, Any] = {
            "model": self.model_dir,
            "tokenizer": self.tokenizer_dir,
            "dtype": self.dtype,
            "seed": self.seed,
            "enforce_eager": self.enforce_eager,
            "logprobs_mode": self.vllm_logprobs_mode,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "tensor_parallel_size": self.tensor_parallel_size,
            # A cached prefix runs a different kernel path than the trainer's full forward.
            "enable_prefix_caching": False,
        }
        if self.max_model_len is not None:
            kwargs["max_model_len"] = self.max_model_len
        if self.top_logprobs > 20:  # vLLM's default max_logprobs
            kwargs["max_logprobs"] = self.top_logprobs
        kwargs.update(self.engine_kwargs)
        return kwargs

    @property
    def llm(self) -> Any:
        """The ``vllm.LLM`` instance, built on first use."""
        if self._llm is None:
            vllm = _import_vllm()
            arg_fields = getattr(getattr(vllm, "EngineArgs", None), "__dataclass_fields__", {})
            if arg_fields and "logprobs_mode" not in arg_fields:
                raise RuntimeError(
                    f"vllm {getattr(vllm, '__version__', '?')} has no logprobs_mode; "
                    "upgrade vllm to a release with EngineArgs.logprobs_mode"
                )
            self._llm = vllm.LLM(**self.llm_kwargs())
        return self._llm

    def generate(self, prompts: list[list[int]], sampling: SamplingSpec) -> Generation:
        """Generate one continuation per prompt (token ids in, token ids and log-probs out)."""
        vllm = _import_vllm()
        params = vllm.SamplingParams(**sampling_params_kwargs(sampling, self.top_logprobs))
        requests = [{"prompt_token_ids": [int(t) for t in p]} for p in prompts]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        return generation_from_outputs(
            outputs,
            prompts,
            logprobs_mode=self.logprobs_mode,
            top_logprobs=self.top_logprobs > 0,
            engine=self.name,
        )

    def close(self) -> None:
        """Drop the engine and release its GPU memory."""
        if self._llm is None:
            return
        self._llm = None
        gc.collect()
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except ImportError:
            pass
