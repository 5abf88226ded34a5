"""Cost of ``paritygate.mismatch`` per call against the least a loop could log instead.

Minimal work: ``(logp_train - logp_infer).abs().max().item()`` on the same tensors (one
statistic, one synchronisation). ``paritygate.mismatch`` computes every statistic and the
diagnosis. Both run alternately in this process on (64, 512) float32 tensors (a GRPO batch of
64 responses of 512 tokens, 10% pads masked); the ratio of medians is printed.

    python benchmarks/bench_mismatch.py [--repeats 200] [--rows 64] [--cols 512] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics

from paired import paired_times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--cols", type=int, default=512)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    import torch

    import paritygate

    gen = torch.Generator().manual_seed(0)
    shape = (args.rows, args.cols)
    logp_infer = (-torch.rand(shape, generator=gen) * 4).to(args.device)
    logp_train = logp_infer + 1e-3 * torch.randn(shape, generator=gen).to(args.device)
    mask = (torch.rand(shape, generator=gen) > 0.1).to(args.device)

    def minimal() -> None:
        (logp_train - logp_infer).abs().max().item()

    def meter() -> None:
        paritygate.mismatch(logp_train, logp_infer, mask)

    t_min, t_met = paired_times(minimal, meter, args.repeats)
    m_min, m_met = statistics.median(t_min), statistics.median(t_met)
    print(f"tensors {shape} float32 on {args.device}, repeats {args.repeats}")
    print(f"(a - b).abs().max():  {m_min * 1e3:8.3f} ms (median)")
    print(f"paritygate.mismatch:  {m_met * 1e3:8.3f} ms (median)")
    print(f"ratio (median): {m_met / m_min:.1f}x; added per call: {(m_met - m_min) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
