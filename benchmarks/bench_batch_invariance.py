"""Cost of batch_invariance against one teacher-forced pass and one greedy decode, in one process.

The model is not the demo: a GPT-2 built from its config (``--layers``, ``--width``) with the
demo's tokenizer, served by HF in fp32 on CPU. Timed, with models and prompts loaded once:
the check's ``measure``; one batched teacher-forced forward over every probe and its greedy
completion (the floor of any log-prob comparison); one batched greedy decode of every probe.
Medians of ``--repeats``. Needs a demo build (``paritygate demo --only lm``):

    python benchmarks/bench_batch_invariance.py --demo demo/lm/model [--repeats 5]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def _model(demo: Path, out: Path, layers: int, width: int) -> None:
    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    out.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                 "generation_config.json"):
        if (demo / name).exists():
            shutil.copy(demo / name, out / name)
    tok = AutoTokenizer.from_pretrained(out)
    config = GPT2Config(vocab_size=len(tok), n_positions=512, n_embd=width, n_layer=layers,
                        n_head=4, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                        pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    GPT2LMHeadModel(config).eval().save_pretrained(out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--demo", type=Path, required=True, help="the demo LM's model directory")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    args = parser.parse_args()
    from paritygate.check import Thresholds
    from paritygate.checks.batch_invariance import DEFAULTS, measure
    from paritygate.engines.batching import HFBatchRunner, collate_padded
    from paritygate.gate import Gate
    from paritygate.load import config_from_dict

    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        _model(args.demo.resolve(), model, args.layers, args.width)
        data = yaml.safe_load((REPO / "configs" / "demo-lm.yaml").read_text())
        lm = data["causal_lm"]
        lm.update(model_dir=str(model), training_only_heads=[],
                  tokenizer={"training": str(model), "serving": str(model)},
                  probes=str(REPO / "golden" / "demo-lm" / "probes.jsonl"))
        for side in ("training", "serving"):
            lm["sampling"][side] = str(REPO / "configs" / lm["sampling"][side])
        data.pop("golden", None)
        ctx = Gate(config_from_dict(data, Path(tmp) / "gate.yaml")).context
        eng = ctx.engines["hf"]
        runner = HFBatchRunner(eng.model, collate_padded, eng.pad_token_id, eng.padding_side)
        prompts = ctx.serving.prompts
        steps = ctx.serving.sampling.spec().max_new_tokens
        eos = {ctx.serving.tokenizer.eos_token_id}
        completions = [t for t, _ in runner.greedy(prompts, steps, eos)]
        measure(ctx, Thresholds(DEFAULTS))  # warm-up

        def timed(fn: object) -> float:
            runs = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                fn()  # type: ignore[operator]
                runs.append(time.perf_counter() - start)
            return statistics.median(runs)

        check = timed(lambda: measure(ctx, Thresholds(DEFAULTS)))
        forward = timed(lambda: runner.score(prompts, completions))
        decode = timed(lambda: runner.greedy(prompts, steps, eos))
    print(f"probes {len(prompts)}, GPT-2 {args.layers}x{args.width}, max_new_tokens {steps}")
    print(f"batch_invariance measure: {check * 1e3:8.1f} ms")
    print(f"one teacher-forced pass:  {forward * 1e3:8.1f} ms  (check = {check / forward:.1f}x)")
    print(f"one greedy decode:        {decode * 1e3:8.1f} ms  "
          f"(check = {check / (forward + decode):.1f}x one pass + one decode)")


if __name__ == "__main__":
    sys.exit(main())
