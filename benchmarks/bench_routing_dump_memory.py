"""Peak memory of ``routing_agreement``'s dump audit vs a plain streaming script.

Subject: a Qwen2-MoE built here from its config (random init, seeded; 8 experts, top-2, 2
layers, hidden 64) with a tokenizer trained locally, saved through ``save_pretrained``. A dump
of sampled records, each carrying the ``routed_experts`` the model's own routers chose (what
routing replay records), is repeated to 10^3, 10^4 and 10^5 records. For each size, as whole
processes and alternately: the gate (``paritygate run CONFIG --check routing_agreement``,
``engines: [dump]``) and the floor, a plain script that loads the model and streams the same
file, one teacher-forced forward per batch of 8 records with the routers' top-k taken from
hooks, nothing kept across batches. Peak RSS from each process's own rusage (``os.wait4``); the
gate's peak must not grow with the record count (target <= 1.2x the floor at 10^5).

    python benchmarks/bench_routing_dump_memory.py [--sizes 1000 10000 100000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

FLOOR = r"""
import json, sys, torch
from transformers import AutoModelForCausalLM
model_dir, dump, pad = sys.argv[1], sys.argv[2], int(sys.argv[3])
torch.set_num_threads(1)  # as the gate runs
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
picked = []
gates = [m for n, m in model.named_modules() if n.endswith("mlp.gate")]
for g in gates:
    g.register_forward_hook(lambda _m, _i, out: picked.append(out[-1].shape))
def run(batch):
    seqs = [r["prompt_ids"] + r["completion_ids"] for r in batch]
    w = max(map(len, seqs))
    ids = torch.tensor([[pad] * (w - len(s)) + s for s in seqs])
    mask = torch.tensor([[0] * (w - len(s)) + [1] * len(s) for s in seqs])
    with torch.inference_mode():
        model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
              use_cache=False)
    picked.clear()
batch = []
with open(dump) as f:
    for line in f:
        batch.append(json.loads(line))
        if len(batch) == 8:
            run(batch); batch = []
if batch:
    run(batch)
"""


def build(root: Path, base: int = 32) -> tuple[Path, list[dict[str, object]], int]:
    """The MoE subject, its probes and sampling files, ``base`` dump records, the pad id."""
    import torch
    import yaml
    from subjects import corpus_tokenizer, save_subject
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    from paritygate.engines.hf_routing import moe_layout, positions, routed_forward

    lines, tok = corpus_tokenizer()
    model = Qwen2MoeForCausalLM(Qwen2MoeConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        shared_expert_intermediate_size=64, num_experts=8, num_experts_per_tok=2,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
        max_position_embeddings=256, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, tie_word_embeddings=False,
    )).eval()
    save_subject(model, tok, root / "model", max_new_tokens=8)
    prompts = [tok(text)["input_ids"][:16] for text in lines[:base]]
    records, seqs = [], []
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for ids in prompts:
            completion = torch.randint(3, len(tok), (8,), generator=gen).tolist()
            logits = model(input_ids=torch.tensor([ids + completion])).logits[0]
            logps = torch.log_softmax(logits.float(), -1)
            lps = [float(logps[len(ids) - 1 + i, t]) for i, t in enumerate(completion)]
            records.append({"prompt_ids": ids, "completion_ids": completion, "logprobs": lps,
                            "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": 0,
                                         "max_tokens": 8}, "logprobs_mode": "processed"})
            seqs.append(ids + completion)
    layout = moe_layout(model)
    assert layout is not None
    capture, mask = routed_forward(model, layout, seqs, tok.pad_token_id)
    per_layer = [capture.layer(r, mask | ~mask)["experts"] for r in layout.routers]
    for rec, where in zip(records, positions(seqs), strict=True):
        rec["routed_experts"] = [[per_layer[li][p].tolist() for li in range(len(per_layer))]
                                 for p in where[:-1]]
    (root / "probes.jsonl").write_text("".join(
        json.dumps({"id": f"p{i}", "text": t}) + "\n" for i, t in enumerate(lines[:4])))
    (root / "sampling.yaml").write_text(yaml.safe_dump(
        {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 8}))
    config = {"name": "bench-routing-dump", "family": "causal_lm", "seed": 0,
              "report_formats": ["json"],
              "causal_lm": {"model_dir": "model", "probes": "probes.jsonl",
                            "sampling": {"training": "sampling.yaml", "serving": "sampling.yaml"},
                            "engines": ["dump"], "engine": {"dump": "dump.jsonl"},
                            "routing": {"dump_experts": True}}}
    (root / "gate.yaml").write_text(yaml.safe_dump(config))
    return root / "gate.yaml", records, int(tok.pad_token_id or 0)


def measure(cmd: list[str]) -> tuple[float, float, int]:
    """Peak RSS (MiB), CPU seconds and exit code of one whole process (one torch thread, as
    the floor runs: CPU seconds of spinning thread pools on a loaded machine compare badly)."""
    env = {**os.environ, "PARITYGATE_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    err = proc.stderr.read().decode() if proc.stderr else ""
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 1):
        raise SystemExit(f"{cmd[:4]} exited {code}: {err[-400:]}")
    return usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime, code


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        config, base, pad = build(root)
        for n in args.sizes:
            with (root / "dump.jsonl").open("w") as f:
                for i in range(n):
                    f.write(json.dumps(base[i % len(base)]) + "\n")
            gate = [sys.executable, "-m", "paritygate", "run", str(config), "--check",
                    "routing_agreement", "--report-dir", str(root / "report"), "--update-golden"]
            floor = [sys.executable, "-c", FLOOR, str(root / "model"), str(root / "dump.jsonl"),
                     str(pad)]
            g_rss, g_cpu, code = measure(gate)
            f_rss, f_cpu, _ = measure(floor)
            report = json.loads((root / "report" / "report.json").read_text())
            check = next(c for c in report["checks"] if c["id"] == "routing_agreement")
            print(f"{n:>7} records: gate {g_rss:7.0f} MiB {g_cpu:6.1f} s cpu "
                  f"({check['status']}, exit {code}, "
                  f"{check['metrics'].get('dump_n_tokens')} tokens) | floor {f_rss:7.0f} MiB "
                  f"{f_cpu:6.1f} s cpu | ratio {g_rss / f_rss:.2f}x memory, "
                  f"{g_cpu / f_cpu:.2f}x cpu", flush=True)


if __name__ == "__main__":
    main()
