"""Cost of the per-layer precision pass, measured side by side in one process.

1. Time: the precision pass (cumulative + local error in float16 and bfloat16,
   ONNX off), measured side by side against
   - three plain forward passes (fp32, fp16, bf16) of the same model on the
     same probes (the issue's target: <= 1.5x), and
   - the minimal work of the report: those three forwards plus, per dtype, one
     bare rerun of every measured layer on its fp32 inputs (what local error
     needs, with no statistics, storage or hooks of ours). Every nesting level
     measured (leaf, attention/MLP block, decoder layer) adds about one
     low-precision forward per dtype to it, so this floor, not three
     forwards, is the cost the pass can approach; the ratio to it is the
     pass's own overhead.
   Plus the sampled mode: local error on the first of eight probe batches
   (``local_max_batches: 1``), cumulative error on all eight.
2. Peak memory: in a fresh subprocess per measurement, the growth of the peak
   resident set (``resource.getrusage(RUSAGE_SELF).ru_maxrss``) from just
   before the model is built to the end, against the fp32 model size, for the
   precision pass and for a plain fp32 forward. Model >= 200 MB. Target <= 2x.
3. Scaling: precision-pass time per layer as the layer count goes 4 -> 32.
   Target: flat (linear total time).

Run: ``python benchmarks/bench_precision.py [--quick]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import subprocess
import sys
import time
from typing import Any

import torch

from paritygate.precision.analysis import run_precision
from paritygate.precision.config import PrecisionSpec
from paritygate.precision.hooks import (
    cast_params,
    floating_tensors,
    map_tensors,
    saturating_cast,
    select_layers,
)
from paritygate.precision.subject import PrecisionSubject


def llama(layers: int, hidden: int, vocab: int = 8192) -> Any:
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=int(hidden * 2.75),
        num_hidden_layers=layers, num_attention_heads=max(hidden // 64, 1),
        num_key_value_heads=max(hidden // 64, 1), max_position_embeddings=256,
    )  # fmt: skip
    return LlamaModel(config).eval()


def probes(n_batches: int, batch: int, tokens: int, vocab: int = 8192) -> list[Any]:
    generator = torch.Generator().manual_seed(0)
    return [
        ((), {"input_ids": torch.randint(0, vocab, (batch, tokens), generator=generator)})
        for _ in range(n_batches)
    ]


def subject(model: Any, batches: list[Any]) -> PrecisionSubject:
    return PrecisionSubject("bench", lambda: model, batches, lambda out: out.last_hidden_state)


def precision_pass(model: Any, batches: list[Any], spec: PrecisionSpec) -> dict[str, Any]:
    return run_precision(subject(model, batches), spec, 16.0, 8.0)


def plain_passes(model: Any, batches: list[Any], dtypes: list[str]) -> None:
    """The minimal work: one forward per batch in fp32, then in each low-precision dtype."""
    with torch.no_grad():
        for _, kwargs in batches:
            model(**kwargs, use_cache=False)
        for name in dtypes:
            restore = cast_params(model, getattr(torch, name))
            try:
                for _, kwargs in batches:
                    model(**kwargs, use_cache=False)
            finally:
                restore()


def minimal_passes(model: Any, batches: list[Any], dtypes: list[str], spec: PrecisionSpec) -> None:
    """The minimal work of the report: three plain forwards plus one rerun per measured layer
    and dtype on its fp32 inputs (the root and layers without floating inputs excepted, as in
    the pass), with each dtype's weights cast once for the whole run."""
    plain_passes(model, batches, dtypes)
    layers = select_layers(model, spec)
    copies: dict[str, dict[int, Any]] = {name: {} for name in dtypes}  # each dtype cast once
    rerunning = False

    def rerun(module: Any, args: Any, kwargs: Any, output: Any) -> None:
        nonlocal rerunning
        if rerunning or not floating_tensors((args, kwargs)):
            return
        rerunning = True
        try:
            for name, copy in copies.items():
                dtype = getattr(torch, name)
                cast = saturating_cast(dtype)
                restore = cast_params(module, dtype, cache=copy)
                try:
                    module(*map_tensors(args, cast), **map_tensors(kwargs, cast))
                finally:
                    restore()
        finally:
            rerunning = False

    handles = [m.register_forward_hook(rerun, with_kwargs=True) for m in layers]
    try:
        with torch.no_grad():
            for _, kwargs in batches:
                model(**kwargs, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()


def best_of(fn: Any, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def model_bytes(model: Any) -> int:
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def bench_time(model: Any, batches: list[Any], repeats: int) -> dict[str, float]:
    dtypes = ["float16", "bfloat16"]
    full, leaves = PrecisionSpec(), PrecisionSpec(layers="leaves")
    fp32 = best_of(lambda: plain_passes(model, batches, []), repeats)
    return {
        "float32_s": fp32,
        **{  # fp32 + one low dtype, less fp32 alone
            f"{name}_s": best_of(lambda n=name: plain_passes(model, batches, [n]), repeats) - fp32
            for name in dtypes
        },
        "plain_s": best_of(lambda: plain_passes(model, batches, dtypes), repeats),
        "minimal_s": best_of(lambda: minimal_passes(model, batches, dtypes, full), repeats),
        "precision_s": best_of(lambda: precision_pass(model, batches, full), repeats),
        "minimal_leaves_s": best_of(
            lambda: minimal_passes(model, batches, dtypes, leaves), repeats
        ),
        "leaves_only_s": best_of(lambda: precision_pass(model, batches, leaves), repeats),
    }


def bench_sampled(model: Any, batches: list[Any], repeats: int) -> dict[str, float]:
    sampled = PrecisionSpec(local_max_batches=1)
    return {
        "plain_s": best_of(lambda: plain_passes(model, batches, ["float16", "bfloat16"]), repeats),
        "sampled_s": best_of(lambda: precision_pass(model, batches, sampled), repeats),
    }


def memory_child(mode: str, layers: int, hidden: int) -> None:
    """Run in a subprocess: print peak-RSS growth and the model size as JSON."""
    batches = probes(1, 2, 64)
    torch.set_num_threads(1)
    # page in the kernels of every dtype first (code pages count as resident memory)
    precision_pass(llama(1, 64), probes(1, 2, 8), PrecisionSpec())
    gc.collect()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    model = llama(layers, hidden)
    size = model_bytes(model)
    if mode == "precision":
        precision_pass(model, batches, PrecisionSpec())
    elif mode == "plain":
        plain_passes(model, batches, ["float16", "bfloat16"])
    else:
        with torch.no_grad():
            model(**batches[0][1], use_cache=False)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"growth": peak - before, "model": size}))


def bench_memory(layers: int, hidden: int) -> dict[str, dict[str, float]]:
    results = {}
    for mode in ("fp32_forward", "plain", "precision"):
        out = subprocess.run(
            [sys.executable, __file__, "--memory-child", mode, str(layers), str(hidden)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="smaller models, one repeat")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: stable)")
    parser.add_argument("--memory-child", nargs=3, metavar=("MODE", "LAYERS", "HIDDEN"))
    args = parser.parse_args()
    if args.memory_child:
        mode, layers, hidden = args.memory_child
        memory_child(mode, int(layers), int(hidden))
        return
    torch.set_num_threads(args.threads)
    repeats = 1 if args.quick else 3
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")

    layers, hidden = 4, 1024
    mem = bench_memory(layers, hidden)
    size = mem["precision"]["model"]
    print(
        f"\n[memory] LlamaModel {layers} layers, hidden {hidden}: fp32 model {size / 2**20:.0f} MiB"
    )
    for mode, r in mem.items():
        print(
            f"  peak RSS growth, {mode:13s}: {r['growth'] / 2**20:7.0f} MiB = "
            f"{r['growth'] / r['model']:.2f}x model (target for precision <= 2x)"
        )

    batches = probes(2, 2, 32)
    hidden = 256 if args.quick else 512
    model = llama(4, hidden)
    t = bench_time(model, batches, repeats)
    print(f"\n[time] LlamaModel 4 layers, hidden {hidden}, 2 batches of 2x32 tokens")
    plain = t["plain_s"]
    fp32 = t["float32_s"]
    lows = ", ".join(f"{n} {t[f'{n}_s']:.3f} s" for n in ("float16", "bfloat16"))
    print(f"  3 plain forwards (fp32+fp16+bf16):   {plain:.3f} s (fp32 {fp32:.3f} s, {lows})")
    for label, pass_key, floor_key in (
        ("leaves+blocks", "precision_s", "minimal_s"),
        ("leaves only", "leaves_only_s", "minimal_leaves_s"),
    ):
        seconds, floor = t[pass_key], t[floor_key]
        print(
            f"  precision pass ({label}): {seconds:.3f} s = {seconds / plain:.2f}x the 3 "
            f"forwards (target <= 1.5x); minimal work {floor:.3f} s = {floor / plain:.2f}x "
            f"the 3 forwards; pass / minimal work {seconds / floor:.2f}x"
        )
    s8 = bench_sampled(model, probes(8, 2, 32), repeats)
    print(
        f"  sampled local (local_max_batches: 1 of 8 batches): {s8['sampled_s']:.3f} s = "
        f"{s8['sampled_s'] / s8['plain_s']:.2f}x the 3 forwards ({s8['plain_s']:.3f} s)"
    )

    print("\n[scaling] precision pass, hidden 256, 1 batch of 2x32 tokens")
    per_layer, plain_per_layer = [], []
    batch = probes(1, 2, 32)
    for n in (4, 8, 16, 32):
        model = llama(n, 256)
        seconds = best_of(lambda m=model: precision_pass(m, batch, PrecisionSpec()), repeats)
        plain = best_of(lambda m=model: plain_passes(m, batch, ["float16", "bfloat16"]), repeats)
        per_layer.append(seconds / n)
        plain_per_layer.append(plain / n)
        print(
            f"  {n:2d} layers: {seconds:.3f} s, {1000 * seconds / n:.1f} ms/layer "
            f"(3 plain forwards: {1000 * plain / n:.1f} ms/layer, ratio {seconds / plain:.2f}x)"
        )
    print(
        f"  ms/layer at 32 vs 4 layers: precision {per_layer[-1] / per_layer[0]:.2f}x, "
        f"plain {plain_per_layer[-1] / plain_per_layer[0]:.2f}x (target ~1, linear)"
    )


if __name__ == "__main__":
    main()
