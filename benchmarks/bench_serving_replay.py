"""serving_replay's throughput at 10^6 records vs the training forward floor.

Floor: the same records' raw observations through the training preprocessing and the training
model, a chunk at a time, from arrays already in memory (no file, no comparison). The check
reads the log from disk (``.npz`` streamed by row blocks, Parquet by record batches, or JSON
lines parsed line by line),
validates every record, replays and compares. Printed: records per second of each and the ratio;
peak RSS growth shows the replay's memory does not grow with the log.

    python benchmarks/bench_serving_replay.py [--records 1000000] [--format npz|jsonl|parquet]
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def write_log(demo: Path, out: Path, records: int, fmt: str) -> Path:
    """A clean log from the demo's serving path (serving normaliser, the ONNX artifact)."""
    import onnxruntime as ort

    from paritygate.demo import policy

    session = ort.InferenceSession(str(demo / "policy.onnx"), providers=["CPUExecutionProvider"])
    raw = policy.probe_observations(records, 7)
    x = policy.normalize_serving(raw, stats_path=demo / "obs_norm.json")
    served = np.concatenate([session.run(None, {"obs": x[i:i + 65536]})[0]
                             for i in range(0, records, 65536)])
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = out / "serving.parquet"
        dim, outs = raw.shape[1], served.shape[1]
        table = pa.table({
            "obs": pa.FixedSizeListArray.from_arrays(pa.array(raw.reshape(-1)), dim),
            "served": pa.FixedSizeListArray.from_arrays(pa.array(served.reshape(-1)), outs)})
        pq.write_table(table, path, row_group_size=65536)
        return path
    if fmt == "npz":
        path = out / "serving.npz"
        np.savez(path, obs=raw, served=served)
        return path
    path = out / "serving.jsonl"
    with path.open("w", encoding="utf-8") as handle:
        for i in range(records):
            handle.write(json.dumps({"obs": raw[i].tolist(), "served": served[i].tolist()}))
            handle.write("\n")
    return path


def floor(demo: Path, raw: np.ndarray, chunk: int) -> float:
    from safetensors.torch import load_file

    from paritygate.demo import policy

    model = policy.build_training_model()
    model.load_state_dict(load_file(str(demo / "policy.safetensors")))
    model.eval()
    start = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(raw), chunk):
            model(policy.normalize_training(raw[i:i + chunk], stats_path=demo / "obs_norm.json"))
    return time.perf_counter() - start


def replay(demo: Path, log: Path, out: Path, records: int, chunk: int) -> tuple[float, str]:
    from paritygate.gate import Gate
    from paritygate.load import config_from_dict

    config = {
        "name": "bench-replay", "family": "policy", "checks": ["serving_replay"],
        "golden": {"dir": str(out / "golden")},
        "policy": {
            "training_factory": "paritygate.demo.policy:build_training_model",
            "inference_factory": "paritygate.demo.policy:build_inference_model",
            "checkpoint": str(demo / "policy.safetensors"),
            "artifact": str(demo / "policy.onnx"),
            "training_heads": ["value_head", "aux_head"], "policy_output": "logits",
            "preprocessing": {"training": "paritygate.demo.policy:normalize_training",
                              "serving": "paritygate.demo.policy:normalize_serving",
                              "stats": str(demo / "obs_norm.json")},
            "probes": {"generator": "paritygate.demo.policy:probe_observations", "count": 64},
            "serving_log": {"path": str(log), "max_records": records, "chunk": chunk},
        },
    }
    gate = Gate(config_from_dict(config, out / "gate.yaml"))
    gate.context  # noqa: B018 - loading is not the replay
    start = time.perf_counter()
    result = gate.evaluate("serving_replay", golden=False)
    return time.perf_counter() - start, result.status


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--format", choices=["npz", "jsonl", "parquet"], default="npz")
    parser.add_argument("--chunk", type=int, default=4096)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from paritygate.demo import policy

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        policy.build(root / "demo")
        demo = root / "demo"
        log = write_log(demo, root, args.records, args.format)
        size_mb = log.stat().st_size / 1e6
        raw = policy.probe_observations(args.records, 7)
        t_floor = floor(demo, raw, args.chunk)
        del raw
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t_replay, status = replay(demo, log, root / "gate", args.records, args.chunk)
        rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert status == "pass", status
    n = args.records
    print(f"log: {args.format}, {n} records, {size_mb:.1f} MB")
    print(f"training forward floor: {t_floor:.2f}s ({n / t_floor:,.0f} records/s)")
    print(f"serving_replay        : {t_replay:.2f}s ({n / t_replay:,.0f} records/s)")
    print(f"ratio replay/floor: {t_replay / t_floor:.2f}x; peak RSS grew "
          f"{(rss_after - rss_before) / 1024:.0f} MB during the replay")


if __name__ == "__main__":
    main()
