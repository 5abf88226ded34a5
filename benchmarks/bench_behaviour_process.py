"""behaviour_parity as a whole process vs a plain script: HF ``generate`` of the same samples
plus the same reward calls.

Subject (not the demo): the 2-layer Qwen2 of ``bench_dump_audit_memory`` (config-built, its
BPE tokenizer trained here, saved and loaded through save_pretrained/from_pretrained), its 8
probes, both sides sampled at temperature 1 for 24 new tokens, ``--samples`` per prompt per
side, and a reward function ``reward(prompt, completion) -> float`` written beside the files.

Gate: ``paritygate run gate.yaml --check behaviour_parity --report-format json``. Plain
script: import torch and transformers, load the tokenizer and the model once per side (as
the gate loads the training and the serving copy), for each side and each probe
``generate(do_sample=True)`` of the samples in one batch, decode, and call the reward on
each (prompt, completion). One thread each (``PARITYGATE_THREADS=1``,
``OMP_NUM_THREADS=1``). Runs alternate gate, plain, plain, gate, ...; CPU seconds (user +
system) of each child; the median of the pair ratios is printed with the machine's load.
Target: <= 1.2x.

    python benchmarks/bench_behaviour_process.py [--repeats 5] [--samples 64]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_dump_audit_memory import NEW_TOKENS, build_lm
from bench_lm_gate import timed

REWARD = '''
def reward(prompt: str, completion: str) -> float:
    """Words of the completion that also occur in the prompt, per word."""
    words = completion.split()
    seen = set(prompt.split())
    return sum(w in seen for w in words) / max(1, len(words))
'''

PLAIN = r'''
import json, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from bench_reward import reward

root, samples, new_tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(1)
torch.manual_seed(0)
probes = [json.loads(line) for line in open(f"{root}/probes.jsonl")]
scores = []
for side in ("training", "serving"):
    tok = AutoTokenizer.from_pretrained(f"{root}/model")
    model = AutoModelForCausalLM.from_pretrained(f"{root}/model", dtype=torch.float32).eval()
    for probe in probes:
        ids = torch.tensor([tok(probe["text"])["input_ids"]] * samples)
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True,
                                 temperature=1.0, top_k=0, top_p=1.0,
                                 max_new_tokens=new_tokens, pad_token_id=tok.pad_token_id)
        for row in out[:, ids.shape[1]:].tolist():
            scores.append(reward(probe["text"], tok.decode(row, skip_special_tokens=True)))
print(len(scores), sum(scores) / len(scores))
'''


def write_gate(root: Path, samples: int) -> Path:
    gate = root / "gate.yaml"
    gate.write_text(f"""name: bench-behaviour
family: causal_lm
seed: 0
checks: [behaviour_parity]
causal_lm:
  model_dir: model
  tokenizer: {{training: model, serving: model}}
  sampling: {{training: train.yaml, serving: serve.yaml}}
  probes: probes.jsonl
  engines: [hf]
  training:
    logprob_fn: paritygate.families.causal_lm.logprobs:compute_logprobs
    logprobs_mode: processed
    dtype: float32
  engine: {{dtype: float32, logprobs_mode: processed}}
  behaviour: {{samples: {samples}, reward_fn: "bench_reward:reward"}}
""")
    return gate


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--samples", type=int, default=64)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build_lm(root)
        (root / "bench_reward.py").write_text(REWARD)
        (root / "plain.py").write_text(PLAIN)
        gate = write_gate(root, args.samples)
        os.environ.update(PARITYGATE_THREADS="1", OMP_NUM_THREADS="1",
                          PYTHONPATH=f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        run_gate = [sys.executable, "-m", "paritygate.cli", "run", str(gate), "--check",
                    "behaviour_parity", "--report-format", "json", "--update-golden",
                    "--report-dir", str(root / "report")]
        run_plain = [sys.executable, str(root / "plain.py"), str(root), str(args.samples),
                     str(NEW_TOKENS)]
        first = subprocess.run(run_gate, check=False, capture_output=True, text=True)
        if first.returncode != 0:
            sys.exit(f"the gate failed on the clean subject:\n{first.stdout[-2000:]}"
                     f"{first.stderr[-2000:]}")
        pairs: list[tuple[float, float]] = []
        for i in range(args.repeats):
            order = (run_gate, run_plain) if i % 2 == 0 else (run_plain, run_gate)
            results = {id(cmd): timed(cmd) for cmd in order}
            g, p = results[id(run_gate)], results[id(run_plain)]
            if g[2] != 0 or p[2] != 0:
                sys.exit(f"exit codes: gate {g[2]}, plain {p[2]}")
            pairs.append((g[1], p[1]))
            print(f"pair {i}: gate {g[1]:.2f} s CPU ({g[0]:.2f} s wall), plain {p[1]:.2f} s "
                  f"CPU ({p[0]:.2f} s wall), ratio {g[1] / p[1]:.3f}", flush=True)
        ratios = [g / p for g, p in pairs]
        print(f"behaviour_parity whole process, {args.samples} samples x 8 probes x 2 sides: "
              f"CPU ratio median {statistics.median(ratios):.3f} (target <= 1.2); "
              f"load {os.getloadavg()}")


if __name__ == "__main__":
    main()
