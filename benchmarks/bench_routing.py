"""routing_agreement as a whole process vs the minimal work, side by side.

Subject: an OLMoE (another MoE class than the routing zoo's Qwen2-MoE) built from a config
(random init, seeded): hidden 256, 4 layers, 16 experts, top-2, a tokenizer trained locally,
and a bf16 served copy declared as such; 16 prompts of 96 tokens. Minimal work (a separate
process): imports, load the training model (fp32) and the served copy (bf16) with transformers,
one teacher-forced forward of each over the left-padded prompts. The check process runs
``paritygate run CONFIG --check routing_agreement`` on the same subject (context, tokenizers,
both models, router hooks on both forwards, structural comparison, report). Runs alternate so
machine noise hits both; the median ratios of wall time and of CPU time (user + system,
steadier on a shared machine) are printed. Target: <= 1.2x.

    python benchmarks/bench_routing.py [--repeats 5]
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
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
train_dir, served_dir, probes = sys.argv[1:4]
tok = AutoTokenizer.from_pretrained(train_dir)
prompts = [tok(json.loads(x)["text"])["input_ids"] for x in open(probes).read().splitlines()]
w = max(len(p) for p in prompts)
ids = torch.tensor([[tok.pad_token_id] * (w - len(p)) + p for p in prompts])
mask = torch.tensor([[0] * (w - len(p)) + [1] * len(p) for p in prompts])
pos = (mask.cumsum(-1) - 1).clamp(min=0)
for d, dtype in ((train_dir, torch.float32), (served_dir, torch.bfloat16)):
    model = AutoModelForCausalLM.from_pretrained(d, dtype=dtype).eval()
    with torch.inference_mode():
        for s in range(0, len(prompts), 8):
            model(input_ids=ids[s:s + 8], attention_mask=mask[s:s + 8],
                  position_ids=pos[s:s + 8], use_cache=False)
"""

PROMPTS = 16
PROMPT_TOKENS = 96


def build_subject(root: Path) -> Path:
    """The OLMoE subject, its bf16 served copy, tokenizer, probes and gate config."""
    import torch
    import yaml
    from subjects import corpus_tokenizer, save_subject
    from transformers import OlmoeConfig, OlmoeForCausalLM

    lines, tok = corpus_tokenizer()
    model = OlmoeForCausalLM(OlmoeConfig(
        vocab_size=len(tok), hidden_size=256, intermediate_size=256, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=8, num_experts=16, num_experts_per_tok=2,
        max_position_embeddings=256, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, tie_word_embeddings=False,
    )).eval()
    save_subject(model, tok, root / "model", max_new_tokens=16)
    model.to(torch.bfloat16).save_pretrained(root / "served")
    tok.save_pretrained(root / "served")
    ids = tok(" ".join(lines))["input_ids"]
    rows = [{"id": f"p{i}", "text": tok.decode(ids[i * PROMPT_TOKENS:(i + 1) * PROMPT_TOKENS])}
            for i in range(PROMPTS)]
    (root / "probes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 16}
    (root / "sampling.yaml").write_text(yaml.safe_dump(sampling))
    config = {"name": "bench-routing", "family": "causal_lm", "seed": 0,
              "causal_lm": {"model_dir": "model", "probes": "probes.jsonl",
                            "serving": {"model_dir": "served", "dtype": "bfloat16"},
                            "sampling": {"training": "sampling.yaml", "serving": "sampling.yaml"},
                            "engines": ["hf"], "routing": {}}}
    path = root / "gate.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def timed(cmd: list[str]) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds (user + system of the child) and the exit code."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(cmd, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        config = build_subject(root)
        minimal = [sys.executable, "-c", MINIMAL, str(root / "model"), str(root / "served"),
                   str(root / "probes.jsonl")]
        report = root / "report"
        check = [sys.executable, "-m", "paritygate", "run", str(config), "--check",
                 "routing_agreement", "--report-dir", str(report), "--update-golden"]
        runs: dict[str, list[tuple[float, float]]] = {"minimal": [], "check": []}
        for i in range(args.repeats + 1):  # the first pair warms the file cache
            order = (("minimal", minimal), ("check", check))
            for name, cmd in order if i % 2 == 0 else order[::-1]:
                wall, cpu, code = timed(cmd)
                if code != 0:
                    raise SystemExit(f"{name} exited {code}: {' '.join(cmd[:4])}")
                if i:
                    runs[name].append((wall, cpu))
        status = json.loads((report / "report.json").read_text())["checks"]
        result = next(c for c in status if c["id"] == "routing_agreement")
        wall = {k: statistics.median(w for w, _ in v) for k, v in runs.items()}
        cpu = {k: statistics.median(c for _, c in v) for k, v in runs.items()}
        print(f"routing_agreement on the bench subject: {result['status']}, "
              f"flip_frac {result['metrics']['flip_frac']:.4f}")
        print(f"minimal (2 loads + 2 forwards): wall {wall['minimal']:.2f}s "
              f"cpu {cpu['minimal']:.2f}s")
        print(f"paritygate --check routing_agreement: wall {wall['check']:.2f}s "
              f"cpu {cpu['check']:.2f}s")
        print(f"ratio: wall {wall['check'] / wall['minimal']:.2f}x, "
              f"cpu {cpu['check'] / cpu['minimal']:.2f}x (target <= 1.2x)")


if __name__ == "__main__":
    main()
