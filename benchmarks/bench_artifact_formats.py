"""The policy gate on a TorchScript and on a torch.export (.pt2) artifact vs the minimal work.

Minimal work, two floors: read the checkpoint, build and load the training and inference models,
load the shipped artifact (``torch.jit.load`` / ``torch.export.load``) and run the probes through
the training model and the artifact once; and that plus the forward passes the checks need
(:func:`minimal_work`). The gate does that plus every policy check and the reports, on the same
artifact. The artifact is built once beforehand (it is the file the team ships; nothing is
exported on either side, whereas the ONNX benchmark's floor holds an on-the-fly export).
Paired runs (``paired.paired_times``); the median ratio is printed per format. Target: <= 1.5x,
as for ONNX (``bench_gate.py``). The policy is the demo's architecture made ``--hidden`` wide
(2048: 4.3M parameters), not the demo: on the 64-wide demo the minimal work is ~25 ms and the
ratio measures the gate's fixed cost (reports, environment record) instead of its work.

    python benchmarks/bench_artifact_formats.py [--repeats 5] [--hidden 2048]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from paired import paired_times

CHECKS = ["weights_load", "batchnorm_export", "head_removal", "dropout_off",
          "preprocessing_parity", "logits_agreement", "export_integrity", "batch_invariance"]


def widen(demo: Path, hidden: int) -> None:
    """Replace the demo checkpoint with a seeded one of the demo's architecture ``hidden``
    units wide (BatchNorm statistics set away from their defaults): not the demo model."""
    from safetensors.torch import save_file

    from paritygate.demo import policy

    torch.manual_seed(1)
    model = policy.build_training_model(hidden=hidden)
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm1d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
    (demo / "manifest.json").unlink()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()},
              str(demo / "policy.safetensors"))


def build_artifacts(demo: Path, hidden: int) -> dict[str, Path]:
    """The inference model as a traced TorchScript file and as a ``.pt2`` program."""
    from safetensors.torch import load_file

    from paritygate.demo import policy

    model = policy.build_inference_model(hidden=hidden)
    model.load_state_dict(policy.inference_state(load_file(str(demo / "policy.safetensors"))))
    model.eval()
    example = torch.zeros(4, 8)
    shipped = demo / "shipped"  # apart from the demo's ONNX manifest
    shipped.mkdir()
    with torch.no_grad():
        torch.jit.save(torch.jit.trace(model, example), str(shipped / "policy.pt"))
    program = torch.export.export(model, (example,),
                                  dynamic_shapes=({0: torch.export.Dim("batch", max=4096)},))
    torch.export.save(program, str(shipped / "policy.pt2"))
    return {"torchscript": shipped / "policy.pt", "torch_export": shipped / "policy.pt2"}


def minimal_work(demo: Path, artifact: Path, fmt: str, hidden: int, *,
                 check_forwards: bool) -> None:
    """Load everything and run the probes once through the training model and the artifact;
    with ``check_forwards`` also the forward passes the checks need on any implementation:
    K = 5 repeated runs of the training model, the inference model and the artifact
    (dropout_off), and each of 16 rows alone, in batches of 1, 2, 7 and 16 and shuffled through
    the training model and the artifact (batchnorm_export's batch independence); and the 64
    probes alone, batched, in pairs, reversed and shuffled through the serving preprocessing and
    the artifact (batch_invariance)."""
    from safetensors.torch import load_file

    from paritygate.demo import policy

    state = load_file(str(demo / "policy.safetensors"))
    training = policy.build_training_model(hidden=hidden)
    training.load_state_dict(state)
    training.eval()
    inference = policy.build_inference_model(hidden=hidden)
    inference.load_state_dict(policy.inference_state(state))
    inference.eval()
    raw = policy.probe_observations(64, 0)
    x = policy.normalize_training(raw, stats_path=demo / "obs_norm.json")
    served: Any = (torch.jit.load(str(artifact), map_location="cpu") if fmt == "torchscript"
                   else torch.export.load(str(artifact)).module())
    with torch.inference_mode():
        training(x)
        served(x)
        if not check_forwards:
            return
        for model in (training, inference, served):
            for _ in range(5):
                model(x)
        rows = x[:16]
        for model in (training, served):
            for i in range(16):
                model(rows[i:i + 1])
            for size in (1, 2, 7, 16):
                for start in range(0, (16 // size) * size, size):
                    model(rows[start:start + size])
            model(rows[torch.randperm(16)])
        # batch_invariance: the serving preprocessing and the artifact on each probe alone, then
        # batched, in pairs, reversed and shuffled
        served_x = torch.as_tensor(policy.normalize_serving(raw, stats_path=demo / "obs_norm.json"))
        for i in range(len(served_x)):
            served(served_x[i:i + 1])
        served(served_x)
        for start in range(0, len(served_x), 2):
            served(served_x[start:start + 2])
        served(served_x.flip(0))
        served(served_x[torch.randperm(len(served_x))])


def gate_work(demo: Path, artifact: Path, out: Path, hidden: int) -> str:
    from paritygate.gate import Gate
    from paritygate.load import config_from_dict
    from paritygate.report import write_reports

    data = {
        "name": "bench-formats", "family": "policy", "checks": CHECKS,
        "allow_pickle": artifact.suffix == ".pt2",
        "report_dir": str(out / "report"), "golden": {"dir": str(out / "golden")},
        "policy": {
            "training_factory": "paritygate.demo.policy:build_training_model",
            "inference_factory": "paritygate.demo.policy:build_inference_model",
            "factory_kwargs": {"hidden": hidden},
            "checkpoint": str(demo / "policy.safetensors"),
            "artifact": str(artifact),
            "training_heads": ["value_head", "aux_head"],
            "policy_output": "logits",
            "preprocessing": {
                "training": "paritygate.demo.policy:normalize_training",
                "serving": "paritygate.demo.policy:normalize_serving",
                "stats": str(demo / "obs_norm.json"), "discrete_features": [7]},
            "probes": {"generator": "paritygate.demo.policy:probe_observations", "count": 64},
        },
    }
    gate = Gate(config_from_dict(data, out / "gate.yaml"))
    results = [gate.evaluate(c.id, golden=False) for c in gate.checks()]
    return write_reports(gate, results, out / "report").status


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=2048,
                        help="trunk width of the gated policy (the demo's is 64)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    import warnings

    warnings.simplefilter("ignore")
    from paritygate.demo import policy

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        demo = root / "demo"
        policy.build(demo)
        widen(demo, args.hidden)
        for fmt, artifact in build_artifacts(demo, args.hidden).items():
            runs = iter(range(10**6))
            statuses: list[str] = []

            def gate(artifact: Path = artifact, runs: Any = runs,
                     statuses: list[str] = statuses) -> None:
                statuses.append(gate_work(demo, artifact, root / f"g{next(runs)}", args.hidden))

            for label, forwards in (("load + one forward", False),
                                    ("load + the checks' forwards", True)):
                t_min, t_gate = paired_times(
                    lambda fmt=fmt, artifact=artifact, forwards=forwards: minimal_work(
                        demo, artifact, fmt, args.hidden, check_forwards=forwards),
                    gate, args.repeats)
                assert set(statuses) == {"pass"}, statuses
                med_min, med_gate = statistics.median(t_min), statistics.median(t_gate)
                print(f"{fmt:13s} vs {label:28s} minimal {med_min:.3f}s  gate {med_gate:.3f}s"
                      f"  ratio {med_gate / med_min:.2f}x (target <= 1.5x)")


if __name__ == "__main__":
    main()
