"""Cost of vllm_delta (with generation_parity decoding on vLLM) as a whole process against
the minimal vLLM work, on the demo LM; vLLM's engine start-up is reported apart.

Minimal work, one process: import vLLM, start the engine (``vllm.LLM``), one sampled and
one greedy generation of the probes with log-probs, load the training model and run its
one teacher-forced forward over the sampled tokens. The gate: ``paritygate run
configs/demo-lm-vllm.yaml`` (``vllm_delta`` and ``generation_parity``, ``engines: [vllm]``)
in its own process, report files included. Both run alternately ``--repeats`` times; the
ratio of medians is printed whole and without the engine start (target <= 1.3x). Needs vLLM
(README, "vLLM") and a demo build (``paritygate demo --only lm``):

    python benchmarks/bench_vllm_delta.py --demo demo/lm [--repeats 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _config(demo: Path, out: Path) -> Path:
    import yaml

    data = yaml.safe_load((REPO / "configs/demo-lm-vllm.yaml").read_text(encoding="utf-8"))
    model = str((demo / "model").resolve())
    lm = data["causal_lm"]
    lm["model_dir"] = model
    lm["tokenizer"] = {"training": model, "serving": model}
    for side in ("training", "serving"):
        lm["sampling"][side] = str(REPO / "configs" / lm["sampling"][side])
    lm["probes"] = str(REPO / "golden/demo-lm/probes.jsonl")
    data["golden"]["dir"] = str(REPO / "golden")
    path = out / "demo-lm-vllm.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def minimal(config_path: Path) -> dict[str, float]:
    """The minimal work, timed by phase (run in a child process: ``--minimal CONFIG``)."""
    start = time.perf_counter()
    import torch
    import vllm

    from paritygate.engines.generation import left_pad
    from paritygate.engines.vllm_engine import VLLMEngine, sampling_params_kwargs
    from paritygate.load import load_config

    config = load_config(config_path)
    lm = config.causal_lm
    assert lm is not None
    from transformers import AutoModelForCausalLM

    from paritygate.families.causal_lm.probes import load_probes
    from paritygate.families.causal_lm.sampling import load_sampling_file
    from paritygate.families.causal_lm.tokenizer import encode_probe, load_tokenizer

    model_dir = config.resolve(lm.model_dir)
    tok = load_tokenizer(model_dir, None)
    probes = load_probes(config.resolve(lm.probes))
    prompts = [encode_probe(tok, p, lm.max_prompt_tokens) for p in probes]
    sampled_prompts = [p for p in prompts for _ in range(lm.generation_samples)]
    sampling = load_sampling_file(
        config.resolve(lm.sampling.serving), trainer=False, eos_text=tok.eos_token,
        eos_id=tok.eos_token_id, side_defaults={"padding_side": "left",
                                                "truncation_side": "left", "dtype": "float32"},
    ).spec()
    engine = VLLMEngine(
        os.environ["BENCH_SERVED_DIR"], dtype="float32", logprobs_mode="processed", top_logprobs=5,
        max_model_len=lm.max_prompt_tokens + sampling.max_new_tokens,
    )
    imported = time.perf_counter()
    llm = engine.llm
    started = time.perf_counter()

    def params(spec, n):
        return [vllm.SamplingParams(**sampling_params_kwargs(spec, 5, i)) for i in range(n)]

    requests = [{"prompt_token_ids": p} for p in sampled_prompts]
    sampled = llm.generate(requests, params(sampling, len(requests)), use_tqdm=False)
    greedy = [{"prompt_token_ids": p} for p in prompts]
    llm.generate(greedy, params(sampling.greedy(), len(greedy)), use_tqdm=False)
    generated = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    seqs = [p + list(o.outputs[0].token_ids) for p, o in zip(sampled_prompts, sampled, strict=True)]
    ids, mask = left_pad(seqs, tok.pad_token_id or 0)
    with torch.inference_mode():
        model(input_ids=ids, attention_mask=mask, use_cache=False)
    done = time.perf_counter()
    engine.close()
    return {
        "imports_and_inputs_s": imported - start,
        "engine_start_s": started - imported,
        "generations_s": generated - started,
        "trainer_forward_s": done - generated,
        "total_s": done - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo", type=Path, default=REPO / "demo" / "lm")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument("--minimal", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.minimal is not None:
        print(json.dumps(minimal(args.minimal)))
        return
    env = {**os.environ, "PARITYGATE_PROGRESS": "off"}
    t_min: list[float] = []
    t_gate: list[float] = []
    phases: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        config = _config(args.demo, Path(tmp))
        from paritygate.families.causal_lm.export import write_serving_copy

        # The minimal work serves an exported copy (no value head: vLLM refuses it), written
        # here, untimed; the gate writes its own copy and pays for it.
        served = Path(tmp) / "served"
        write_serving_copy((args.demo / "model").resolve(), served, ["v_head."])
        env["BENCH_SERVED_DIR"] = str(served)
        for i in range(args.repeats):
            order = ("minimal", "gate") if i % 2 == 0 else ("gate", "minimal")
            for side in order:
                start = time.perf_counter()
                if side == "minimal":
                    proc = subprocess.run(
                        [sys.executable, __file__, "--minimal", str(config)], env=env,
                        capture_output=True, text=True,
                    )
                    if proc.returncode != 0:
                        sys.exit(f"the minimal work failed:\n{proc.stderr[-3000:]}")
                    out = proc.stdout
                    t_min.append(time.perf_counter() - start)
                    phases.append(json.loads(out.strip().splitlines()[-1]))
                else:
                    proc = subprocess.run(
                        [sys.executable, "-m", "paritygate", "run", str(config),
                         "--report-dir", str(Path(tmp) / f"report-{i}")],
                        env=env, capture_output=True, text=True,
                    )
                    t_gate.append(time.perf_counter() - start)
                    if proc.returncode != 0:
                        sys.exit(f"the gate failed (exit {proc.returncode}):\n{proc.stdout}\n"
                                 f"{proc.stderr[-3000:]}")
    m_min, m_gate = statistics.median(t_min), statistics.median(t_gate)
    start_s = statistics.median(p["engine_start_s"] for p in phases)
    figures = {
        "repeats": args.repeats,
        "minimal_s": t_min,
        "gate_s": t_gate,
        "minimal_phases": phases,
        "engine_start_s": start_s,
        "ratio": m_gate / m_min,
        "ratio_without_engine_start": (m_gate - start_s) / (m_min - start_s),
    }
    print(f"minimal vLLM work (whole process): {m_min:7.1f} s (median of {args.repeats})")
    print(f"paritygate run (vllm_delta, generation_parity): {m_gate:7.1f} s")
    print(f"vLLM engine start (in the minimal work): {start_s:7.1f} s")
    print(f"phases of the minimal work (median run): {phases[len(phases) // 2]}")
    print(f"ratio: {figures['ratio']:.2f}x whole, {figures['ratio_without_engine_start']:.2f}x "
          "without the engine start (target <= 1.3x)")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
