"""Cost of behaviour_parity against the floor of its sampling, and a large dump's audit.

1. Paired, in one process, models loaded once: the check's ``measure`` on the demo LM (HF on
   both sides, the default 64 samples per prompt per side) against the bare work it cannot
   avoid: generating the same samples with the same engine (HF ``generate``, both sides, same
   batching). Target: median ratio <= 1.2.
2. A dump of ``--records`` sampled records per side, written as 4 JSONL shards per side,
   audited by the check from the dumps in streaming batches: records/s against the trainer's
   forward floor (one batched teacher-forced forward over the same records, nothing else),
   and the peak RSS growth while auditing (O(batch): the same for 10^4 and 10^5 records).

Needs a demo build (``paritygate demo --only lm``):

    python benchmarks/bench_behaviour_parity.py --demo demo/lm/model [--repeats 3]
        [--records 100000]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from paired import paired_times  # noqa: E402


def _config(demo: Path, out: Path, behaviour: dict[str, Any]) -> Any:
    from paritygate.load import config_from_dict

    cfg_file = REPO / "configs" / "demo-lm.yaml"
    data = yaml.safe_load(cfg_file.read_text())
    lm = data["causal_lm"]
    lm["model_dir"] = str(demo)
    lm["tokenizer"] = {"training": str(demo), "serving": str(demo)}
    for side in ("training", "serving"):
        lm["sampling"][side] = str((cfg_file.parent / lm["sampling"][side]).resolve())
    lm["probes"] = str((cfg_file.parent / lm["probes"]).resolve())
    lm["behaviour"] = behaviour
    data.pop("golden", None)
    return config_from_dict(data, out / "gate.yaml")


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def paired(demo: Path, out: Path, repeats: int) -> None:
    from paritygate.checks.behaviour_parity import DEFAULTS, measure
    from paritygate.engines.hf_generate import HFGenerateEngine
    from paritygate.families.causal_lm.behaviour_sides import side_sampling
    from paritygate.gate import Gate

    ctx: Any = Gate(_config(demo, out, {})).context
    n = ctx.spec.behaviour.samples
    kept = [i for i, (a, b) in enumerate(zip(ctx.training.prompts, ctx.serving.prompts,
                                             strict=True)) if a and b]
    training = HFGenerateEngine.for_tokenizer(
        ctx.training.model(), ctx.training.tokenizer, logprobs_mode="raw", top_logprobs=0,
        batch_size=ctx.spec.engine.batch_size)

    def floor() -> None:
        for side, engine in ((ctx.training, training), (ctx.serving, ctx.engines["hf"])):
            prompts = [side.prompts[i] for i in kept for _ in range(n)]
            engine.generate(prompts, side_sampling(side, ctx.config.seed))

    def check() -> None:
        m = measure(ctx, dict(DEFAULTS))
        assert m.skipped is None, m.skipped

    t_floor, t_check = paired_times(floor, check, repeats)
    ratios = [c / f for f, c in zip(t_floor, t_check, strict=True)]
    print(f"paired ({len(kept)} prompts x {n} samples x 2 sides, {repeats} repeats): "
          f"generate floor median {statistics.median(t_floor):.2f} s, check median "
          f"{statistics.median(t_check):.2f} s, ratio median {statistics.median(ratios):.3f} "
          f"(each {', '.join(f'{r:.3f}' for r in ratios)})")


def _write_dump(folder: Path, records: int, vocab: int, seed: int) -> list[Path]:
    import numpy as np

    rng = np.random.default_rng(seed)
    folder.mkdir()
    paths = [folder / f"shard-{k}.jsonl" for k in range(4)]
    handles = [p.open("w") for p in paths]
    prompts = [rng.integers(3, vocab, 12).tolist() for _ in range(max(1, records // 64))]
    for i in range(records):
        length = int(rng.integers(1, 17))
        reason = "length" if length == 16 else "eos"
        handles[(i // 64) % 4].write(json.dumps({
            "prompt_ids": prompts[i // 64 % len(prompts)],
            "completion_ids": rng.integers(3, vocab, length).tolist(),
            "finish_reason": reason}) + "\n")
    for h in handles:
        h.close()
    return paths


def dump_audit(demo: Path, out: Path, records: int, batch: int) -> None:
    from paritygate.checks.behaviour_parity import DEFAULTS, measure
    from paritygate.engines.dump_stream import stream_draws
    from paritygate.engines.generation import Generation
    from paritygate.families.causal_lm.behaviour_sides import SCORE_BATCH
    from paritygate.families.causal_lm.recompute import teacher_forced_rows
    from paritygate.gate import Gate

    vocab = json.loads((demo / "config.json").read_text())["vocab_size"]
    shards = {side: _write_dump(out / f"{side}-dump", records, vocab, seed)
              for seed, side in enumerate(("training", "serving"))}
    ctx: Any = Gate(_config(demo, out, {
        "training_dump": [str(p) for p in shards["training"]],
        "serving_dump": [str(p) for p in shards["serving"]], "batch_size": batch})).context
    model = ctx.training.model()
    start = time.perf_counter()
    for side in ("training", "serving"):
        for draws in stream_draws(shards[side], batch=batch):
            gen = Generation([list(d.prompt_ids) for d in draws],
                             [d.completion_ids for d in draws], [[] for _ in draws], None,
                             "raw", "floor")
            teacher_forced_rows(model, gen, 0, batch_size=SCORE_BATCH)
    floor = time.perf_counter() - start
    before = _rss_mib()
    start = time.perf_counter()
    m = measure(ctx, dict(DEFAULTS))
    audit = time.perf_counter() - start
    grown = _rss_mib() - before
    total = 2 * records
    print(f"dump audit: {total} records (2 sides x {records}, 4 shards each, batch {batch}): "
          f"check {audit:.1f} s = {total / audit:.0f} records/s; trainer forward floor "
          f"{floor:.1f} s = {total / floor:.0f} records/s; ratio {audit / floor:.2f}; peak RSS "
          f"growth during the audit {grown:.1f} MiB ({len(m.findings)} findings, skipped: "
          f"{m.skipped})")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--demo", type=Path, required=True, help="the demo LM's model directory")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--records", type=int, default=100_000, help="dump records per side")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--skip-paired", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_paired:
            (Path(tmp) / "p").mkdir()
            paired(args.demo.resolve(), Path(tmp) / "p", args.repeats)
        if args.records:
            (Path(tmp) / "d").mkdir()
            dump_audit(args.demo.resolve(), Path(tmp) / "d", args.records, args.batch)


if __name__ == "__main__":
    main()
