"""The policy gate as a whole process vs a plain script doing the same loads and passes.

Subject (not the demo): a 3-block, hidden-96 MLP actor-critic with BatchNorm and dropout
(12 observation features, 5 actions, a value head), trained 60 steps so its BatchNorm
statistics are real, saved as safetensors, exported to ONNX with its manifest; a torch/numpy
observation normaliser pair; 64 probes. Its module is written beside the files and put on
``PYTHONPATH`` for both processes.

Gate: ``paritygate run gate.yaml`` (every policy check the subject has; the default report
formats: report.json, report.md, junit.xml). Minimal work, a plain script: imports, read the
checkpoint and the manifest, build and load the training and serving models, open the
artifact in ONNX Runtime and read its graph, normalise the probes both ways, the training
forward, the serving forward, 5 repeats of each side, the artifact at batch sizes 1, 2 and 7,
the artifact's initializers against the checkpoint, and one fp16 and one bf16 pass with
per-layer hooks (each layer's output compared with its fp32 output and the layer rerun alone
on its fp32 input). One thread each (``PARITYGATE_THREADS=1``). Runs alternate gate, minimal,
minimal, gate, ...; CPU seconds (user + system) of each child; the median of the pair ratios
is printed with the machine's load. paritygate's modules are compiled to bytecode first, as an
install does (a source checkout run with ``PYTHONDONTWRITEBYTECODE=1`` would compile them in
every gate process). Target: <= 1.2x.

    python benchmarks/bench_policy_process.py [--repeats 7] [--html]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_lm_gate import timed

MODULE = r'''
import json
import numpy as np
import torch
from torch import nn

OBS, ACTIONS, HIDDEN = 12, 5, 96


def _trunk():
    layers = []
    for i in range(3):
        layers += [nn.Linear(OBS if i == 0 else HIDDEN, HIDDEN), nn.BatchNorm1d(HIDDEN),
                   nn.Tanh(), nn.Dropout(0.05)]
    return nn.Sequential(*layers)


class Training(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = _trunk()
        self.pi = nn.Linear(HIDDEN, ACTIONS)
        self.critic = nn.Linear(HIDDEN, 1)

    def forward(self, x):
        h = self.trunk(x)
        return {"logits": self.pi(h), "value": self.critic(h).squeeze(-1)}


class Serving(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = _trunk()
        self.pi = nn.Linear(HIDDEN, ACTIONS)

    def forward(self, x):
        return self.pi(self.trunk(x))


def training_model():
    return Training()


def serving_model():
    return Serving()


def norm_torch(raw, *, stats_path):
    s = json.load(open(stats_path))
    x = torch.as_tensor(np.asarray(raw, dtype=np.float32))
    return ((x - torch.tensor(s["mean"])) / torch.tensor(s["std"])).clamp(-5, 5)


def norm_numpy(raw, *, stats_path):
    s = json.load(open(stats_path))
    x = np.asarray(raw, dtype=np.float32)
    z = (x - np.asarray(s["mean"], np.float32)) / np.asarray(s["std"], np.float32)
    return np.clip(z, -5, 5).astype(np.float32)


def probes(count, seed):
    rng = np.random.default_rng(seed)
    return (2.0 + 3.0 * rng.standard_normal((count, OBS))).astype(np.float32)
'''

MINIMAL = r"""
import hashlib, json, sys
import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import numpy_helper
from safetensors.torch import load_file
import bench_subject as m

torch.set_num_threads(1)
d = sys.argv[1]
raw_bytes = open(f"{d}/policy.safetensors", "rb").read()
manifest = json.load(open(f"{d}/manifest.json"))
digest = hashlib.sha256(raw_bytes).hexdigest()
state = load_file(f"{d}/policy.safetensors")
training = m.training_model()
training.load_state_dict(state)
training.eval()
serving = m.serving_model()
serving.load_state_dict({k: v for k, v in state.items() if not k.startswith("critic.")})
serving.eval()
options = ort.SessionOptions()
options.intra_op_num_threads = 1
session = ort.InferenceSession(f"{d}/policy.onnx", options, providers=["CPUExecutionProvider"])
graph = onnx.load(f"{d}/policy.onnx").graph
inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
for k, v in state.items():
    for a in inits.values():
        if a.shape == tuple(v.shape):
            np.abs(a - v.numpy()).max()
raw = m.probes(64, 0)
x = m.norm_torch(raw, stats_path=f"{d}/stats.json")
xs = m.norm_numpy(raw, stats_path=f"{d}/stats.json")
np.abs(x.numpy() - xs).max()
with torch.inference_mode():
    ref = training(x)["logits"].numpy()
    for _ in range(5):
        np.abs(training(x)["logits"].numpy() - ref).max()
        np.abs(serving(x).numpy() - ref).max()
art = session.run(None, {"obs": xs})[0]
np.abs(art - ref).max()
for _ in range(5):
    session.run(None, {"obs": xs})
for b in (1, 2, 7):
    for i in range(0, 64 - 64 % b, b):
        session.run(None, {"obs": xs[i:i + b]})
layers = [mod for mod in serving.modules() if not list(mod.children())]
inputs, outputs = {}, {}
def keep(mod, args, out):
    inputs[mod], outputs[mod] = args[0], out
hooks = [layer.register_forward_hook(keep) for layer in layers]
with torch.inference_mode():
    serving(x)
for h in hooks:
    h.remove()
def rel(a, b):
    return torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b)
for dtype in (torch.float16, torch.bfloat16):
    low = {}
    def cmp(mod, args, out):
        low[mod] = rel(out.float(), outputs[mod])
    hooks = [layer.register_forward_hook(cmp) for layer in layers]
    with torch.inference_mode():
        serving.to(dtype)(x.to(dtype))
        for h in hooks:
            h.remove()
        for layer in layers:
            local = layer(inputs[layer].to(dtype)).float()
            rel(local, outputs[layer])
    serving.float()
"""


def build_subject(root: Path) -> Path:
    """Train, save and export the subject into ``root``; write its gate config."""
    import json

    import torch
    import yaml
    from safetensors.torch import save_file

    from paritygate.families.policy.export import export_onnx, write_manifest

    (root / "bench_subject.py").write_text(MODULE, encoding="utf-8")
    sys.path.insert(0, str(root))
    import bench_subject as m

    torch.manual_seed(0)
    raw = m.probes(4096, 99)
    (root / "stats.json").write_text(json.dumps(
        {"mean": raw.mean(0).tolist(), "std": raw.std(0).tolist()}), encoding="utf-8")
    model = m.training_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(60):
        x = m.norm_torch(m.probes(128, step), stats_path=root / "stats.json")
        out = model(x)
        logits = out["logits"]
        loss = (logits.logsumexp(-1) - logits[:, 0]).mean() + out["value"].pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(root / "policy.safetensors"))
    serving = m.serving_model()
    serving.load_state_dict({k: v for k, v in state.items() if not k.startswith("critic.")})
    serving.eval()
    art = export_onnx(serving, torch.zeros(2, m.OBS), root / "policy.onnx", input_name="obs",
                      output_names=["logits"])
    write_manifest(art, root / "policy.safetensors", opset=18)
    config = {
        "name": "bench-process", "family": "policy", "seed": 0, "golden": {"dir": "golden"},
        "policy": {
            "training_factory": "bench_subject:training_model",
            "inference_factory": "bench_subject:serving_model",
            "checkpoint": "policy.safetensors", "artifact": "policy.onnx",
            "training_heads": ["critic"], "policy_output": "logits", "input_name": "obs",
            "output_names": ["logits"], "action_space": "discrete",
            "preprocessing": {"training": "bench_subject:norm_torch",
                              "serving": "bench_subject:norm_numpy", "stats": "stats.json"},
            "probes": {"generator": "bench_subject:probes", "count": 64, "seed": 0},
            "batch_sizes": [1, 2, 7], "dropout_repeats": 5,
        },
    }
    path = root / "gate.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    (root / "minimal.py").write_text(MINIMAL, encoding="utf-8")
    return path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--html", action="store_true",
                        help="also ask for report.html (figures drawn) on the gate side")
    args = parser.parse_args()
    import compileall

    import paritygate

    compileall.compile_dir(str(Path(paritygate.__file__).parent), quiet=1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        config = build_subject(root)
        os.environ["PYTHONPATH"] = os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])
        os.environ["PARITYGATE_THREADS"] = "1"
        gate = [sys.executable, "-m", "paritygate", "run", str(config),
                "--report-dir", str(root / "report")]
        if args.html:
            gate += ["--report-format", "json,md,junit,html"]
        minimal = [sys.executable, str(root / "minimal.py"), str(root)]
        bless = subprocess.run([*gate, "--update-golden"], check=False, capture_output=True,
                               text=True)
        assert bless.returncode == 0, bless.stdout[-2000:] + bless.stderr[-2000:]
        assert timed(minimal)[2] == 0
        ratios, cpu_gate, cpu_min = [], [], []
        for i in range(args.repeats):
            order = [(gate, cpu_gate), (minimal, cpu_min)]
            for cmd, cpus in order if i % 2 == 0 else order[::-1]:
                _, cpu, code = timed(cmd)
                assert code == 0, (cmd, code)
                cpus.append(cpu)
            ratios.append(cpu_gate[-1] / cpu_min[-1])
    load = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    print(f"load: {load}")
    print(f"minimal script CPU s: median {statistics.median(cpu_min):.2f}  "
          f"runs {[round(c, 2) for c in cpu_min]}")
    print(f"paritygate run CPU s: median {statistics.median(cpu_gate):.2f}  "
          f"runs {[round(c, 2) for c in cpu_gate]}")
    print(f"ratio gate/minimal (median of pairs): {statistics.median(ratios):.2f}x "
          f"[{min(ratios):.2f}-{max(ratios):.2f}] (target <= 1.2x)")


if __name__ == "__main__":
    main()
