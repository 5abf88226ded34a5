"""Whole policy gate on the demo vs the minimal work it must do, side by side in one process.

Minimal work: read the checkpoint, build and load the training and inference
models, export the inference model to ONNX, open it in ONNX Runtime, and run
the probes through torch and through the artifact once. The gate does that plus
every check and the reports. Runs alternate (minimal, gate, minimal, gate, ...)
so machine noise hits both; the median ratio is printed. Target: <= 1.5x.

    python benchmarks/bench_gate.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch


def minimal_work(demo: Path, out: Path) -> None:
    from safetensors.torch import load_file

    from paritygate.demo import policy
    from paritygate.engines.onnxruntime_engine import make_session
    from paritygate.families.policy.export import export_onnx

    state = load_file(str(demo / "policy.safetensors"))
    training = policy.build_training_model()
    training.load_state_dict(state)
    training.eval()
    inference = policy.build_inference_model()
    inference.load_state_dict(policy.inference_state(state))
    inference.eval()
    raw = policy.probe_observations(64, 0)
    x = policy.normalize_training(raw, stats_path=demo / "obs_norm.json")
    artifact = export_onnx(
        inference, x[:2], out / "policy.onnx", input_name="obs", output_names=["logits"]
    )
    session = make_session(artifact)
    with torch.inference_mode():
        training(x)
    session.run(None, {"obs": np.ascontiguousarray(x.numpy())})


def gate_work(demo: Path, out: Path) -> str:
    from paritygate.gate import Gate
    from paritygate.load import config_from_dict
    from paritygate.report import write_reports

    data = {
        "name": "bench-policy",
        "family": "policy",
        "checks": [
            "weights_load",
            "batchnorm_export",
            "head_removal",
            "dropout_off",
            "preprocessing_parity",
            "logits_agreement",
            "export_integrity",
        ],
        "report_dir": str(out / "report"),
        "golden": {"dir": str(out / "golden")},
        "policy": {
            "training_factory": "paritygate.demo.policy:build_training_model",
            "inference_factory": "paritygate.demo.policy:build_inference_model",
            "checkpoint": str(demo / "policy.safetensors"),
            "training_heads": ["value_head", "aux_head"],
            "policy_output": "logits",
            "preprocessing": {
                "training": "paritygate.demo.policy:normalize_training",
                "serving": "paritygate.demo.policy:normalize_serving",
                "stats": str(demo / "obs_norm.json"),
                "discrete_features": [7],
            },
            "probes": {"generator": "paritygate.demo.policy:probe_observations", "count": 64},
        },
    }
    gate = Gate(config_from_dict(data, out / "gate.yaml"))
    results = [gate.evaluate(c.id, golden=False) for c in gate.checks()]
    written = write_reports(gate, results, out / "report")
    return written.status


def _timed(fn: Any, *args: Any) -> tuple[float, Any]:
    """Run ``fn`` with the cyclic GC collected beforehand and paused, as timeit does.

    The exporter allocates enough objects to trigger a full collection every
    other call; left on, it lands on whichever side happens to run then.
    """
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter()
        out = fn(*args)
        return time.perf_counter() - t0, out
    finally:
        gc.enable()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from paritygate.demo import policy

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        demo = root / "demo"
        policy.build(demo)
        minimal_work(demo, root / "warm")  # warm imports and the exporter once for both
        gate_work(demo, root / "warm-gate")
        t_min, t_gate = [], []
        for i in range(args.repeats):
            t_min.append(_timed(minimal_work, demo, root / f"m{i}")[0])
            seconds, status = _timed(gate_work, demo, root / f"g{i}")
            t_gate.append(seconds)
            assert status == "pass", status
    med_min, med_gate = statistics.median(t_min), statistics.median(t_gate)
    print(f"minimal work : median {med_min:.3f}s  runs {[round(t, 3) for t in t_min]}")
    print(f"whole gate   : median {med_gate:.3f}s  runs {[round(t, 3) for t in t_gate]}")
    print(f"ratio gate/minimal: {med_gate / med_min:.2f}x (target <= 1.5x)")


if __name__ == "__main__":
    main()
