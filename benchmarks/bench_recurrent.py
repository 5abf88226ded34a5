"""Cost of the recurrent_parity check against the minimal work it cannot avoid.

Minimal work: step the same T-step sequences (the same probe rows, episode starts and
``sequences`` parallel episodes) through the training model (torch, eval, no autograd) and the
artifact (ONNX Runtime), each fed its own state back: one forward per side per step.
recurrent_parity does that plus the feeds' bookkeeping, the comparisons and the report
details (its teacher-forced diagnosis runs only on a failure). Both run in this process,
alternately, on an sb3-contrib RecurrentPPO policy trained on CartPole-v1 here (seeded, LSTM of
64, not the demo), with the models loaded once; the ratios of medians and of minima are
printed (target <= 1.3).

    python benchmarks/bench_recurrent.py [--repeats 9] [--steps 32] [--sequences 16]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from paired import paired_times

HIDDEN = 64


def build_subject(folder: Path, steps: int, sequences: int) -> Path:
    """RecurrentPPO on CartPole-v1, exported, with its gate config."""
    import yaml
    from sb3_contrib import RecurrentPPO

    from paritygate.families.policy import export_artifact
    from paritygate.load import config_from_dict

    folder.mkdir(parents=True, exist_ok=True)
    model = RecurrentPPO("MlpLstmPolicy", "CartPole-v1", n_steps=128, batch_size=64,
                         n_epochs=2, seed=0, device="cpu",
                         policy_kwargs={"lstm_hidden_size": HIDDEN, "net_arch": [64]})
    model.learn(256)
    model.save(folder / "rppo.zip")
    np.save(folder / "probes.npy",
            np.random.default_rng(0).normal(0, 0.5, (64, 4)).astype(np.float32))
    data: dict[str, Any] = {
        "name": "bench-recurrent", "family": "policy", "checks": ["recurrent_parity"],
        "policy": {
            "training_factory": "paritygate.adapters.sb3:recurrent_training_policy",
            "inference_factory": "paritygate.adapters.sb3:recurrent_inference_policy",
            "factory_kwargs": {"obs_dim": 4, "n_actions": 2, "lstm_hidden_size": HIDDEN,
                               "net_arch": [64]},
            "checkpoint": "rppo.zip",
            "training_heads": ["value_net", "mlp_extractor.value_net", "lstm_critic"],
            "policy_output": 0,
            "inputs": ["obs", "h_in", "c_in", "episode_start"],
            "output_names": ["logits", "h_out", "c_out"],
            "recurrent": {
                "states": [{"input": "h_in", "output": "h_out", "shape": [HIDDEN]},
                           {"input": "c_in", "output": "c_out", "shape": [HIDDEN]}],
                "episode_start": "episode_start", "steps": steps, "sequences": sequences,
            },
            "probes": {"file": "probes.npy"},
        },
        "golden": {"dir": "golden"},
    }
    config = folder / "gate.yaml"
    export_artifact(config_from_dict(data, config), folder)
    data["policy"]["artifact"] = "policy.onnx"
    config.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return config


def minimal_sequences(ctx: Any, session: Any, probes: np.ndarray) -> None:
    """Both models step every sequence, each fed its own state; episode starts flagged."""
    import torch

    rec = ctx.spec.recurrent
    rows = rec.sequences
    t = np.arange(rec.steps)[:, None]
    starts = ((t == 0) | ((t + np.arange(rows)[None]) % rec.reset_every == 0)).astype(np.float32)
    model = ctx.reference_model
    h = c = np.zeros((rows, HIDDEN), np.float32)
    hs = cs = h
    for step in range(rec.steps):
        obs = probes[(step * rows + np.arange(rows)) % len(probes)]
        with torch.inference_mode():
            _, h_t, c_t = model(torch.from_numpy(obs), torch.from_numpy(h), torch.from_numpy(c),
                                torch.from_numpy(starts[step]))
        h, c = h_t.numpy(), c_t.numpy()
        _, hs, cs = session.run(None, {"obs": obs, "h_in": hs, "c_in": cs,
                                       "episode_start": starts[step]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--sequences", type=int, default=16)
    args = parser.parse_args()

    import torch

    from paritygate.check import Thresholds
    from paritygate.checks.recurrent_parity import CHECK
    from paritygate.engines.onnxruntime_engine import make_session
    from paritygate.families.policy.build import build_policy_context
    from paritygate.load import load_config

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "subject"
        config = load_config(build_subject(folder, args.steps, args.sequences))
        ctx = build_policy_context(config)
        session = make_session(folder / "policy.onnx")
        probes = ctx.probes
        thresholds = Thresholds(CHECK.defaults)

        def minimal() -> None:
            minimal_sequences(ctx, session, probes)

        def check() -> None:
            m = CHECK.measures["policy"](ctx, thresholds)
            assert not m.findings, m.findings

        t_min, t_chk = paired_times(minimal, check, args.repeats)
        m_min, m_chk = statistics.median(t_min), statistics.median(t_chk)
        print(f"{args.steps} steps x {args.sequences} sequences, LSTM {HIDDEN}, "
              f"repeats {args.repeats}")
        print(f"minimal work (step both models): {m_min * 1e3:8.1f} ms (median)")
        print(f"recurrent_parity check:          {m_chk * 1e3:8.1f} ms (median)")
        print(f"ratio of medians: {m_chk / m_min:.2f}x, ratio of minima: "
              f"{min(t_chk) / min(t_min):.2f}x (target <= 1.3x)")


if __name__ == "__main__":
    main()
