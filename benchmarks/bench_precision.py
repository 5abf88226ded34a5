"""Cost of the per-layer precision pass, measured side by side in one process.

1. Time: the precision pass (cumulative + local error in float16 and bfloat16,
   ONNX off) against three plain forward passes (fp32, fp16, bf16) of the same
   model on the same probes. Target <= 1.5x.
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
from paritygate.precision.hooks import cast_params
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


def bench_time(layers: int, hidden: int, batches: list[Any], repeats: int) -> dict[str, float]:
    model = llama(layers, hidden)
    dtypes = ["float16", "bfloat16"]
    plain = best_of(lambda: plain_passes(model, batches, dtypes), repeats)
    full = best_of(lambda: precision_pass(model, batches, PrecisionSpec()), repeats)
    leaves_only = PrecisionSpec(layers="leaves")
    leaves = best_of(lambda: precision_pass(model, batches, leaves_only), repeats)
    return {"plain_s": plain, "precision_s": full, "leaves_only_s": leaves}


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
    print(f"\n[memory] LlamaModel {layers} layers, hidden {hidden}: "
          f"fp32 model {size / 2**20:.0f} MiB")
    for mode, r in mem.items():
        print(f"  peak RSS growth, {mode:13s}: {r['growth'] / 2**20:7.0f} MiB = "
              f"{r['growth'] / r['model']:.2f}x model (target for precision <= 2x)")

    batches = probes(2, 2, 32)
    hidden = 256 if args.quick else 512
    t = bench_time(4, hidden, batches, repeats)
    print(f"\n[time] LlamaModel 4 layers, hidden {hidden}, 2 batches of 2x32 tokens")
    print(f"  3 plain forwards (fp32+fp16+bf16): {t['plain_s']:.3f} s")
    print(f"  precision pass (leaves+blocks):    {t['precision_s']:.3f} s = "
          f"{t['precision_s'] / t['plain_s']:.2f}x (target <= 1.5x)")
    print(f"  precision pass (leaves only):      {t['leaves_only_s']:.3f} s = "
          f"{t['leaves_only_s'] / t['plain_s']:.2f}x")

    print("\n[scaling] precision pass, hidden 256, 1 batch of 2x32 tokens")
    per_layer, plain_per_layer = [], []
    batch = probes(1, 2, 32)
    for n in (4, 8, 16, 32):
        model = llama(n, 256)
        seconds = best_of(lambda m=model: precision_pass(m, batch, PrecisionSpec()), repeats)
        plain = best_of(lambda m=model: plain_passes(m, batch, ["float16", "bfloat16"]), repeats)
        per_layer.append(seconds / n)
        plain_per_layer.append(plain / n)
        print(f"  {n:2d} layers: {seconds:.3f} s, {1000 * seconds / n:.1f} ms/layer "
              f"(3 plain forwards: {1000 * plain / n:.1f} ms/layer, ratio {seconds / plain:.2f}x)")
    print(f"  ms/layer at 32 vs 4 layers: precision {per_layer[-1] / per_layer[0]:.2f}x, "
          f"plain {plain_per_layer[-1] / plain_per_layer[0]:.2f}x (target ~1, linear)")


if __name__ == "__main__":
    main()
