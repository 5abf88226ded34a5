"""Cost of the logprob_delta check against the minimal work it cannot avoid.

Minimal work: the engine's generation (HF generate, KV cache) of the probe
continuations plus one teacher-forced forward of the training model over the
same tokens. logprob_delta does that plus the log-prob gathering, the masking
and the statistics. Both run in this process, alternately, on the demo LM (built
into a temporary folder, or ``--demo DIR`` holding ``model/``), with models loaded
once; the ratios of medians and of minima are printed (target <= 1.3).

    python benchmarks/bench_logprob_delta.py [--repeats 7] [--demo demo/lm]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from paired import paired_times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--demo", type=Path, default=None)
    args = parser.parse_args()

    import torch
    import yaml

    from paritygate.check import Thresholds
    from paritygate.checks.logprob_delta import CHECK
    from paritygate.engines.generation import left_pad
    from paritygate.families.causal_lm.build import build_lm_context
    from paritygate.load import config_from_dict

    torch.set_num_threads(max(1, torch.get_num_threads()))
    with tempfile.TemporaryDirectory() as tmp:
        demo = args.demo
        if demo is None:
            from paritygate.demo.causal_lm import build

            demo = Path(tmp) / "lm"
            build(demo)
        repo = Path(__file__).resolve().parents[1]
        data = yaml.safe_load((repo / "configs/demo-lm.yaml").read_text())
        lm = data["causal_lm"]
        model_dir = str((demo / "model").resolve())
        lm["model_dir"] = model_dir
        lm["tokenizer"] = {"training": model_dir, "serving": model_dir}
        config = config_from_dict(data, repo / "configs" / "demo-lm.yaml")
        ctx = build_lm_context(config)
        engine = ctx.engines["hf"]
        reference = ctx.training.model()
        sampling = ctx.serving.sampling.spec()
        prompts = [p for p in ctx.serving.prompts for _ in range(ctx.spec.generation_samples)]
        pad = ctx.training.tokenizer.pad_token_id
        thresholds = Thresholds(CHECK.defaults)

        def minimal() -> None:
            gen = engine.generate(prompts, sampling)
            seqs = [p + o for p, o in zip(gen.prompt_ids, gen.output_ids, strict=True)]
            ids, mask = left_pad(seqs, pad)
            with torch.inference_mode():
                reference(input_ids=ids, attention_mask=mask)

        def check() -> None:
            ctx.generations.__dict__.pop("_samples", None)  # generate again, not memoised
            CHECK.measures["causal_lm"](ctx, thresholds)

        t_min, t_chk = paired_times(minimal, check, args.repeats)
        m_min, m_chk = statistics.median(t_min), statistics.median(t_chk)
        tokens = sum(len(p) for p in prompts)
        print(f"sequences {len(prompts)}, prompt tokens {tokens}, repeats {args.repeats}")
        print(f"minimal work (generate + one forward): {m_min * 1e3:8.1f} ms (median)")
        print(f"logprob_delta check:                   {m_chk * 1e3:8.1f} ms (median)")
        print(
            f"spread: minimal {min(t_min) * 1e3:.1f}-{max(t_min) * 1e3:.1f} ms, "
            f"check {min(t_chk) * 1e3:.1f}-{max(t_chk) * 1e3:.1f} ms"
        )
        # On a shared machine the minimum is the least disturbed run of each side.
        print(
            f"ratio of medians: {m_chk / m_min:.2f}x, ratio of minima: "
            f"{min(t_chk) / min(t_min):.2f}x (target <= 1.3x)"
        )


if __name__ == "__main__":
    main()
