"""reward_parity and reference_parity as whole processes vs the minimal work of each.

Subjects (not the demo): a 3-layer, hidden-96 Qwen2 policy built from a config (seeded), its
initial policy (every matrix moved by 0.3 of its spread) saved as the KL reference, and a
3-layer, hidden-96 Qwen2 sequence classifier (one label) as the reward model, with a tokenizer
trained locally; 24 (prompt, completion) samples and 6 probes of 24 tokens.

Minimal work, each a separate process:
- reward: imports, load the classifier and tokenizer, encode the samples, and one batched
  forward per variant ``reward_parity`` needs (the serving layout, 3 more pads, the reversed
  order, each length group unpadded, the completions repeated 1-3 times);
- reference: imports, read the initial policy's and the reference's tensors and compare them,
  load the reference and the policy, and one forward of each over the probes' RL layout.
The gate process is ``paritygate run`` on a config that selects the one check. Runs alternate;
the median ratios of wall and CPU time are printed. Target: <= 1.3x.

    python benchmarks/bench_rl_loop.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_lm_gate import timed

REWARD_MINIMAL = r"""
import json, sys, torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer
d, samples = sys.argv[1], sys.argv[2]
tok = AutoTokenizer.from_pretrained(d)
model = AutoModelForSequenceClassification.from_pretrained(d, dtype=torch.float32).eval()
rows = [json.loads(x) for x in open(samples).read().splitlines()]
def enc(p, c): return tok(p + c + tok.eos_token)["input_ids"]
def fwd(seqs, extra=0):
    w = max(map(len, seqs)) + extra
    ids = torch.tensor([[tok.pad_token_id] * (w - len(s)) + s for s in seqs])
    with torch.inference_mode():
        return model(input_ids=ids, attention_mask=(ids != tok.pad_token_id).long()).logits
seqs = [enc(r["prompt"], r["completion"]) for r in rows]
fwd(seqs); fwd(seqs, 3); fwd(seqs[::-1])
groups = {}
for s in seqs: groups.setdefault(len(s), []).append(s)
for g in groups.values(): fwd(g)
fwd([enc(r["prompt"], r["completion"] * k) for r in rows for k in (1, 2, 3)])
"""

REFERENCE_MINIMAL = r"""
import json, sys, torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer
policy, ref, initial, probes = sys.argv[1:5]
a, b = load_file(initial + "/model.safetensors"), load_file(ref + "/model.safetensors")
assert all(torch.equal(a[k], b[k]) for k in a)
tok = AutoTokenizer.from_pretrained(policy)
models = [AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
          for d in (ref, policy)]
seqs = [tok(json.loads(x)["text"])["input_ids"] for x in open(probes).read().splitlines()]
w = max(map(len, seqs)) + 1
ids = torch.tensor([[tok.pad_token_id] * (w - len(s)) + s for s in seqs])
mask = (ids != tok.pad_token_id).long()
with torch.inference_mode():
    for m in models:
        m(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0))
"""


def build_subjects(root: Path) -> dict[str, Path]:
    import shutil

    import torch
    import yaml
    from bench_lm_gate import build_subject
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForSequenceClassification

    from paritygate.demo.causal_lm import CORPUS

    lm_gate = build_subject(root)  # the Qwen2 policy, tokenizer, probes, sampling file
    policy = root / "model"
    initial = root / "initial"
    shutil.copytree(policy, initial)
    state = load_file(str(initial / "model.safetensors"))
    gen = torch.Generator().manual_seed(10)
    for name, tensor in state.items():
        if tensor.dim() == 2:
            state[name] = (tensor + torch.randn(tensor.shape, generator=gen) * tensor.std()
                           * 0.3).contiguous()
    save_file(state, str(initial / "model.safetensors"), metadata={"format": "pt"})
    shutil.copytree(initial, root / "reference")

    tok = AutoTokenizer.from_pretrained(policy)
    torch.manual_seed(1)
    rm = Qwen2ForSequenceClassification(Qwen2Config(
        vocab_size=len(tok), hidden_size=96, intermediate_size=384, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        num_labels=1, pad_token_id=tok.pad_token_id)).eval()
    rm.save_pretrained(root / "reward")
    tok.save_pretrained(root / "reward")
    lines = [ln.strip() for ln in CORPUS.read_text(encoding="utf-8").splitlines() if ln.strip()]
    with (root / "samples.jsonl").open("w") as fh:
        for line in lines[300:324]:
            words = line.split(" ")
            half = len(words) // 2
            fh.write(json.dumps({"prompt": " ".join(words[:half]),
                                 "completion": " " + " ".join(words[half:])}) + "\n")
    base = yaml.safe_load(lm_gate.read_text())
    gates = {}
    for check, block in (
        ("reward_parity", {"reward": {"model_dir": str(root / "reward"),
                                      "completions": str(root / "samples.jsonl"),
                                      "training": {"padding_side": "left"}}}),
        ("reference_parity", {"reference": {"model_dir": str(root / "reference"),
                                            "initial": str(initial)}}),
    ):
        cfg = json.loads(json.dumps(base))
        cfg["name"] = f"bench-{check}"
        cfg.pop("skip_checks")
        cfg["checks"] = [check]
        cfg["causal_lm"].update(block)
        path = root / f"{check}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        gates[check] = path
    return gates


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        gates = build_subjects(root)
        (root / "reward_min.py").write_text(REWARD_MINIMAL)
        (root / "reference_min.py").write_text(REFERENCE_MINIMAL)
        minimal = {
            "reward_parity": [sys.executable, str(root / "reward_min.py"), str(root / "reward"),
                              str(root / "samples.jsonl")],
            "reference_parity": [sys.executable, str(root / "reference_min.py"),
                                 str(root / "model"), str(root / "reference"),
                                 str(root / "initial"), str(root / "probes.jsonl")],
        }
        for check, gate in gates.items():
            run = [sys.executable, "-m", "paritygate.cli", "run", str(gate),
                   "--report-dir", str(root / f"report-{check}")]
            blessed = subprocess.run([*run, "--update-golden"], check=False,
                                     capture_output=True)
            if blessed.returncode != 0:
                sys.exit(f"{check}: blessing failed:\n{blessed.stdout.decode()[-2000:]}")
            mins, runs = [], []
            for _ in range(args.repeats):
                mins.append(timed(minimal[check]))
                runs.append(timed(run))
                if runs[-1][2] != 0 or mins[-1][2] != 0:
                    sys.exit(f"{check}: exit {runs[-1][2]} (gate), {mins[-1][2]} (minimal)")
            report = json.loads((root / f"report-{check}" / "report.json").read_text())
            seconds = [c["duration_s"] for c in report["checks"] if c["id"] == check]
            print(f"{check}: check itself {seconds[0]:.2f} s in the last run")
            for i, what in ((0, "wall"), (1, "CPU")):
                m = statistics.median(x[i] for x in mins)
                g = statistics.median(x[i] for x in runs)
                print(f"  {what:4s} minimal {m:5.1f} s, gate {g:5.1f} s: {g / m:.2f}x "
                      "(target <= 1.3x)")


if __name__ == "__main__":
    main()
