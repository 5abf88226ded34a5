"""Whole causal-LM gate as a process vs the minimal work, side by side.

Subject: a 3-layer, hidden-96 Qwen2 built from a config (random init, seeded), with a
tokenizer trained locally, and 6 prompts of 24 tokens. Minimal work (a separate process):
imports, load the model and tokenizer, one sampled and one greedy batched generation with
a KV cache, one teacher-forced forward over prompt + completion. The gate process runs
``paritygate run`` on the same subject (CPU checks). Runs alternate so machine noise hits
both; the median ratios of wall time and of CPU time (user + system, steadier on a
shared machine) are printed. The gate runs against its own blessed golden, as in
production, and must pass. Target: <= 1.5x.

    python benchmarks/bench_lm_gate.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MINIMAL = r"""
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
d = sys.argv[1]
tok = AutoTokenizer.from_pretrained(d)
model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
ids = [json_line for json_line in open(sys.argv[2]).read().splitlines()]
import json
prompts = [tok(json.loads(x)["text"])["input_ids"] for x in ids]
w = max(len(p) for p in prompts)
inp = torch.tensor([[tok.pad_token_id] * (w - len(p)) + p for p in prompts])
mask = (inp != tok.pad_token_id).long()
with torch.inference_mode():
    torch.manual_seed(0)
    s = model.generate(input_ids=inp, attention_mask=mask, do_sample=True, max_new_tokens=16,
                       top_k=0, pad_token_id=tok.pad_token_id, output_scores=True,
                       return_dict_in_generate=True)
    g = model.generate(input_ids=inp, attention_mask=mask, do_sample=False, max_new_tokens=16,
                       pad_token_id=tok.pad_token_id)
    full = s.sequences
    m = torch.ones_like(full); m[:, :w] = mask
    model(input_ids=full, attention_mask=m, position_ids=(m.cumsum(-1) - 1).clamp(min=0))
"""


def build_subject(root: Path) -> Path:
    """The Qwen2 subject, its tokenizer, probes, sampling files and a README-style config."""
    import torch
    import yaml
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from paritygate.demo.causal_lm import CORPUS, _train_tokenizer

    torch.manual_seed(0)
    lines = [ln.strip() for ln in CORPUS.read_text(encoding="utf-8").splitlines() if ln.strip()]
    tok = _train_tokenizer(lines)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=len(tok), hidden_size=96, intermediate_size=384, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, tie_word_embeddings=False,
    )).eval()
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
        max_new_tokens=16,
    )
    mdir = root / "model"
    model.save_pretrained(mdir)
    tok.save_pretrained(mdir)
    probes = root / "probes.jsonl"
    text = " ".join(lines)
    ids = tok(text)["input_ids"]
    rows = []
    for i in range(6):
        chunk = ids[i * 24 : i * 24 + 23]  # + BOS = 24 tokens
        rows.append(json.dumps({"id": f"p{i}", "text": tok.decode(chunk)}))
    probes.write_text("\n".join(rows) + "\n")
    (root / "train.yaml").write_text(
        "temperature: 1.0\ntop_p: 1.0\ntop_k: -1\nmax_new_tokens: 16\nseed: 0\n"
    )
    cfg = {
        "name": "bench-lm", "family": "causal_lm", "seed": 0,
        "golden": {"dir": str(root / "golden")},
        "skip_checks": ["vllm_delta"],
        "causal_lm": {
            "model_dir": str(mdir), "probes": str(probes),
            "sampling": {"training": str(root / "train.yaml")},
            "engines": ["hf"],
        },
    }
    path = root / "gate.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def timed(cmd: list[str]) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds user + system, exit code) of one child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    done = subprocess.run(cmd, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.returncode


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        gate = build_subject(root)
        minimal_py = root / "minimal.py"
        minimal_py.write_text(MINIMAL)
        run = [sys.executable, "-m", "paritygate.cli", "run", str(gate),
               "--report-dir", str(root / "report")]
        blessed = subprocess.run([*run, "--update-golden"], check=False, capture_output=True)
        if blessed.returncode != 0:
            sys.exit(f"blessing the subject's golden failed:\n{blessed.stdout.decode()[-2000:]}")
        mins, gates = [], []
        per_check: dict[str, list[float]] = {}
        for _ in range(args.repeats):
            mins.append(timed([sys.executable, str(minimal_py), str(root / "model"),
                               str(root / "probes.jsonl")]))
            gates.append(timed(run))
            if gates[-1][2] != 0:
                sys.exit(f"the gate did not pass on its own golden (exit {gates[-1][2]})")
            report = json.loads((root / "report" / "report.json").read_text())
            for check in report["checks"]:
                per_check.setdefault(check["id"], []).append(float(check["duration_s"]))
        for check_id, seconds in per_check.items():
            print(f"  {check_id:22s} {statistics.median(seconds):6.2f} s (median)")
        for i, what in ((0, "wall"), (1, "CPU")):
            m = statistics.median(x[i] for x in mins)
            g = statistics.median(x[i] for x in gates)
            for label, value, runs in (("minimal work", m, mins), ("whole gate  ", g, gates)):
                listed = ", ".join(f"{x[i]:.1f}" for x in runs)
                print(f"{what:4s} {label} {value:5.1f} s (runs {listed})")
            print(f"{what:4s} ratio: {g / m:.2f}x (target <= 1.5x)")

if __name__ == "__main__":
    main()
