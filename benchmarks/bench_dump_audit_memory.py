"""Peak memory of a rollout dump's audit (`engines: [dump]`) vs a plain streaming script.

Builds a small LM of its own (a 2-layer Qwen2, a BPE tokenizer trained here, saved with
save_pretrained), its sampled and greedy rollouts with the model's own log-probs, and dumps of
10^3, 10^4 and 10^5 records (the rollouts repeated). For each size it runs, as whole processes
and alternately, the gate (`paritygate run CONFIG --check logprob_delta --check
generation_parity`) and the floor: a plain script that loads the checkpoint, streams the same
file and does the same recompute (a teacher-forced forward per batch of 8, the delta of every
sampled token, the greedy argmax along every greedy record). Each process's peak RSS comes from
its own rusage (``os.wait4``), with its CPU seconds; the ratio gate / floor is printed
(target <= 1.2 at 10^5).

    python benchmarks/bench_dump_audit_memory.py [--sizes 1000 10000 100000] [--repeats 1]
    python benchmarks/bench_dump_audit_memory.py --floor CONFIG_DIR   # the floor alone
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

WORDS = (
    "the", "cat", "dog", "sat", "ran", "on", "a", "mat", "in", "house", "red", "blue", "old",
    "new", "big", "small", "tree", "river", "went", "to", "market", "bread", "tea", "book",
    "quiet", "garden", "flower", "wind", "cold", "warm", "sun", "rain",
)
SAMPLED, GREEDY, NEW_TOKENS = 96, 32, 24


def build_lm(out: Path, seed: int = 0) -> None:
    """A small Qwen2 LM and its tokenizer in ``out/model``, probes and sampling files."""
    import random

    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (
        GenerationConfig,
        PreTrainedTokenizerFast,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    rng = random.Random(seed)
    torch.manual_seed(seed)
    lines = [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(400)]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(lines, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<pad>", "<unk>", "<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>",
                                   eos_token="<eos>")
    model_dir = out / "model"
    config = Qwen2Config(vocab_size=len(fast), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, pad_token_id=fast.pad_token_id,
                         eos_token_id=fast.eos_token_id, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(config).eval()
    model.generation_config = GenerationConfig(eos_token_id=fast.eos_token_id,
                                               pad_token_id=fast.pad_token_id)
    model.save_pretrained(model_dir)
    fast.save_pretrained(model_dir)
    probes = [{"id": f"p{i}", "text": " ".join(rng.choice(WORDS) for _ in range(6))}
              for i in range(8)]
    (out / "probes.jsonl").write_text("".join(json.dumps(p) + "\n" for p in probes))
    common = "temperature: 1.0\ntop_p: 1.0\ntop_k: 0\nrepetition_penalty: 1.0\nseed: 0\n"
    (out / "train.yaml").write_text(common + f"max_new_tokens: {NEW_TOKENS}\nmin_new_tokens: 0\n"
                                    "stop: []\npadding_side: left\ndtype: float32\n")
    (out / "serve.yaml").write_text(common + f"max_tokens: {NEW_TOKENS}\nmin_tokens: 0\n"
                                    "stop: []\n")


def rollouts(out: Path, seed: int = 0) -> list[dict[str, object]]:
    """The model's own sampled and greedy rollouts, with its log-probs (teacher-forced)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out / "model")
    model = AutoModelForCausalLM.from_pretrained(out / "model").eval()
    rng = __import__("random").Random(seed)
    records: list[dict[str, object]] = []
    torch.manual_seed(seed)
    for i in range(SAMPLED + GREEDY):
        greedy = i >= SAMPLED
        prompt = tok(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))))["input_ids"]
        ids = torch.tensor([prompt])
        with torch.inference_mode():
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=not greedy,
                                 top_k=0, max_new_tokens=NEW_TOKENS,
                                 pad_token_id=tok.pad_token_id)[0, len(prompt):].tolist()
            logits = model(torch.tensor([prompt + gen])).logits[0, len(prompt) - 1: -1]
        lps = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(gen)[:, None])[:, 0]
        records.append({"prompt_ids": prompt, "completion_ids": gen,
                        "logprobs": [float(v) for v in lps], "engine": "bench",
                        "sampling": {"temperature": 0.0 if greedy else 1.0, "top_p": 1.0,
                                     "top_k": -1, "max_tokens": NEW_TOKENS}})
    return records


def write_dump(path: Path, base: list[dict[str, object]], n: int) -> None:
    lines = [json.dumps(r) + "\n" for r in base]
    with path.open("w") as fh:
        for i in range(n):
            fh.write(lines[i % len(lines)])


def write_config(out: Path, dump: Path) -> Path:
    config = out / f"gate-{dump.stem}.yaml"
    config.write_text(f"""name: bench-dump
family: causal_lm
seed: 0
checks: [logprob_delta, generation_parity]
causal_lm:
  model_dir: model
  tokenizer: {{training: model, serving: model}}
  sampling: {{training: train.yaml, serving: serve.yaml}}
  probes: probes.jsonl
  engines: [dump]
  training:
    logprob_fn: paritygate.families.causal_lm.logprobs:compute_logprobs
    logprobs_mode: processed
    dtype: float32
  engine: {{dtype: float32, logprobs_mode: processed, dump: {dump.name}}}
""")
    return config


def floor(config: Path) -> None:
    """The minimal work: load the checkpoint, stream the dump, recompute every token."""
    import torch
    import yaml
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    spec = yaml.safe_load(config.read_text())["causal_lm"]
    base = config.parent
    model = AutoModelForCausalLM.from_pretrained(base / spec["model_dir"]).eval()
    pad = 0
    total = worst = 0.0
    tokens = agree = 0

    def run(batch: list[dict], greedy: bool) -> None:
        nonlocal total, worst, tokens, agree
        seqs = [r["prompt_ids"] + r["completion_ids"] for r in batch]
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), pad)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, width - len(s):] = torch.tensor(s)
            mask[i, width - len(s):] = 1
        with torch.inference_mode():
            logits = model(input_ids=ids, attention_mask=mask,
                           position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
            logp = torch.log_softmax(logits.float(), -1)
        for i, r in enumerate(batch):
            k = len(r["completion_ids"])
            if not k:
                continue
            rows = logp[i, width - k - 1: width - 1]
            out = torch.tensor(r["completion_ids"])
            if greedy:
                agree += int((rows.argmax(-1) == out).sum())
            else:
                delta = rows.gather(-1, out[:, None])[:, 0].double() - torch.tensor(r["logprobs"])
                total += float(delta.sum())
                worst = max(worst, float(delta.abs().max()))
            tokens += k

    for greedy in (False, True):
        batch: list[dict] = []
        with (base / spec["engine"]["dump"]).open() as fh:
            for line in fh:
                rec = json.loads(line)
                if (rec["sampling"]["temperature"] == 0.0) != greedy:
                    continue
                batch.append(rec)
                if len(batch) == 8:
                    run(batch, greedy)
                    batch = []
        if batch:
            run(batch, greedy)
    print(json.dumps({"tokens": tokens, "delta_sum": total, "delta_max": worst, "agree": agree}))


def _measure(cmd: list[str], cwd: Path) -> tuple[float, float, int]:
    """(peak RSS MiB, CPU s, exit code) of one whole process (CPU: user + system, which a
    loaded machine disturbs less than wall time)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode not in (0, 1):
        sys.stderr.write(err[-2000:])
    return usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime, proc.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--floor", type=Path, default=None, help="run the floor on CONFIG")
    parser.add_argument("--dir", type=Path, default=None, help="keep the built files here")
    parser.add_argument("--paritygate", default=None,
                        help="the paritygate executable to measure (default: this venv's)")
    args = parser.parse_args()
    if args.floor is not None:
        floor(args.floor)
        return
    work = args.dir or Path(tempfile.mkdtemp(prefix="bench-dump-"))
    work.mkdir(parents=True, exist_ok=True)
    if not (work / "model" / "config.json").is_file():
        build_lm(work)
        (work / "base.json").write_text(json.dumps(rollouts(work)))
    base = json.loads((work / "base.json").read_text())
    gate_exe = args.paritygate or str(Path(sys.executable).with_name("paritygate"))
    print(f"load: {os.getloadavg()}; dir {work}")
    for n in args.sizes:
        dump = work / f"dump-{n}.jsonl"
        if not dump.is_file():
            write_dump(dump, base, n)
        config = write_config(work, dump)
        gate = [gate_exe, "run", str(config), "--check", "logprob_delta", "--check",
                "generation_parity", "--report-dir", str(work / f"report-{n}")]
        plain = [sys.executable, __file__, "--floor", str(config)]
        peaks: dict[str, list[float]] = {"gate": [], "floor": []}
        cpu: dict[str, list[float]] = {"gate": [], "floor": []}
        for _ in range(args.repeats):
            for name, cmd in (("gate", gate), ("floor", plain)):
                rss, seconds, code = _measure(cmd, work)
                peaks[name].append(rss)
                cpu[name].append(seconds)
                if name == "gate" and code not in (0, 1):
                    raise SystemExit(f"gate exited {code}")
        g, f = statistics.median(peaks["gate"]), statistics.median(peaks["floor"])
        print(f"{n:>7} records ({dump.stat().st_size / 2**20:.0f} MiB): gate {g:7.0f} MiB "
              f"({statistics.median(cpu['gate']):.0f} s CPU), floor {f:7.0f} MiB "
              f"({statistics.median(cpu['floor']):.0f} s CPU), ratio {g / f:.2f}x")
    print(f"load: {os.getloadavg()}")


if __name__ == "__main__":
    main()
