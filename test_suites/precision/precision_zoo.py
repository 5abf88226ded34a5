"""Tiny models and subjects of the precision fault zoo, built in-process (no gate needed)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from paritygate.check import Thresholds
from paritygate.checks.precision_per_layer import CHECK
from paritygate.precision.config import PrecisionSpec
from paritygate.precision.subject import PrecisionSubject
from paritygate.result import Measurement

OBS, HIDDEN, ACTIONS, DEPTH = 16, 64, 6, 3


class Block(nn.Module):
    """Pre-norm residual MLP block: x + down(relu(up(norm(x))))."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.act = nn.ReLU()
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, H) -> (B, H)
        return x + self.down(self.act(self.up(self.norm(x))))


class Policy(nn.Module):
    """A residual MLP policy: obs (B, OBS) -> action logits (B, ACTIONS)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(OBS, HIDDEN)
        self.blocks = nn.Sequential(*[Block(HIDDEN) for _ in range(DEPTH)])
        self.head = nn.Linear(HIDDEN, ACTIONS)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.inp(obs)))


def clean_policy() -> Policy:
    torch.manual_seed(1234)
    return Policy().eval()


def rescaled_policy(log2_scale: int, block: int = 1) -> Policy:
    """Same fp32 function, fragile numerics: ``up`` scaled by 2^s and ``down`` by 2^-s.

    ReLU is positively homogeneous and power-of-two scaling is exact in fp32,
    so the fp32 outputs are unchanged; in float16 the hidden activations of
    that block overflow (large s) or sink into subnormals (negative s).
    """
    model = clean_policy()
    target = model.blocks[block]
    with torch.no_grad():
        target.up.weight.mul_(2.0**log2_scale)
        target.up.bias.mul_(2.0**log2_scale)
        target.down.weight.mul_(2.0**-log2_scale)
    return model


def probe_batches(
    n_batches: int = 2, rows: int = 32
) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    generator = torch.Generator().manual_seed(7)
    return [((torch.randn(rows, OBS, generator=generator),), {}) for _ in range(n_batches)]


def subject(
    factory: Any, onnx_path: Path | None = None, batches: list[Any] | None = None
) -> PrecisionSubject:
    batches = batches or probe_batches()
    feeds = [{"obs": a[0].numpy()} for a, _ in batches] if onnx_path else None
    return PrecisionSubject(
        name="zoo",
        build_model=factory,
        batches=batches,
        select_output=lambda out: out,
        onnx_path=onnx_path,
        onnx_feeds=feeds,
        onnx_output_name="logits" if onnx_path else None,
    )


@dataclass
class FakeConfig:
    precision: PrecisionSpec = field(default_factory=PrecisionSpec)
    name: str = "zoo"


@dataclass
class FakeContext:
    """The part of a family context the precision check uses."""

    subject: PrecisionSubject
    config: FakeConfig = field(default_factory=FakeConfig)
    family: str = "policy"

    def precision_subject(self) -> PrecisionSubject:
        return self.subject


def export_onnx(model: nn.Module, path: Path) -> Path:
    """Export with the dynamo exporter (it records module scopes on every node)."""
    program = torch.onnx.export(
        model,
        (torch.randn(4, OBS),),
        dynamo=True,
        input_names=["obs"],
        output_names=["logits"],
        dynamic_shapes={"obs": {0: torch.export.Dim("batch")}},
        verbose=False,
    )
    program.save(str(path))
    return path


def measure(ctx: FakeContext) -> Measurement:
    """The check's measurement with its default thresholds."""
    return CHECK.measures[ctx.family](ctx, Thresholds(CHECK.defaults))
