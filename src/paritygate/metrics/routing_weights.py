"""What two loaded MoE models' routing tensors say before any token runs: router weights moved
beyond the served precision's rounding, experts stored in another order, a shared expert gone.

Each helper takes the training and the serving model (and their :class:`.routing.MoeLayout`)
and returns plain records; ``routing_agreement`` turns them into findings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

    from paritygate.engines.hf_routing import MoeLayout

_ROUNDING = {"torch.float32": 1e-6, "torch.float16": 2.0**-10, "torch.bfloat16": 2.0**-7}
"""Relative difference ||served - cast(training)|| / ||training|| a clean copy stays under: a
few units of the served dtype's rounding (unit roundoff 2^-24, 2^-11, 2^-8), per tensor."""


def _rel(served: Tensor, training: Tensor, dtype: torch.dtype | None = None) -> float:
    """Relative difference of ``served`` from ``training`` cast to ``dtype`` (default: the
    served dtype)."""
    ref = training.detach().to(served.dtype if dtype is None else dtype).float()
    diff = (served.detach().float() - ref).norm()
    scale = ref.norm()
    return float(diff / scale) if float(scale) > 0 else float(diff)


def rounding_bound(tensor: Tensor) -> float:
    """The relative rounding bound of ``tensor``'s dtype (:data:`_ROUNDING`)."""
    return _ROUNDING.get(str(tensor.dtype), 2.0**-7)


@dataclass(frozen=True)
class RouterDiff:
    """A router whose served weights differ beyond rounding."""

    router: str
    rel_diff: float
    bound: float


def _weight(model: nn.Module, name: str) -> Tensor:
    import torch

    weight = model.get_submodule(name).weight
    assert isinstance(weight, torch.Tensor)
    return weight


def router_diffs(training: nn.Module, serving: nn.Module, layout: MoeLayout) -> list[RouterDiff]:
    """Routers whose served weight differs from the training one beyond the served dtype's
    rounding (shape changes count as differing). A served weight that is the training one
    rounded to bf16 or fp16 and loaded wider (an undeclared lower-precision copy) is a
    precision change, ``weights_load``'s finding, not a router difference."""
    import torch

    out = []
    for name in layout.routers:
        t, s = _weight(training, name), _weight(serving, name)
        if t.shape != s.shape:
            out.append(RouterDiff(name, float("inf"), 0.0))
            continue
        rel, bound = _rel(s, t), rounding_bound(s)
        rounded = any(_rel(s, t, low) <= _ROUNDING["torch.float32"]
                      for low in (torch.bfloat16, torch.float16))
        if rel > bound and not rounded:
            out.append(RouterDiff(name, rel, bound))
    return out


def _expert_rows(model: nn.Module, block: str, experts: int) -> Tensor | None:
    """``(E, D)``: each expert's tensors flattened into one row (fused ``gate_up_proj`` /
    ``down_proj`` split on their expert axis, or one submodule per expert)."""
    import torch

    module = model.get_submodule(f"{block}.experts")
    parts = []
    for _, param in sorted(module.named_parameters()):
        if param.dim() >= 2 and param.shape[0] == experts:
            parts.append(param.detach().float().reshape(experts, -1))
    if parts:
        return torch.cat(parts, dim=1)
    children = list(module.children())
    if len(children) == experts:
        return torch.stack([torch.cat([p.detach().float().reshape(-1)
                                       for _, p in sorted(c.named_parameters())])
                            for c in children])
    return None


@dataclass(frozen=True)
class Permutation:
    """A layer whose served experts are the training experts in another order:
    ``order[e]`` is the training expert stored at served slot ``e``."""

    block: str
    order: tuple[int, ...]
    router_follows: bool
    """The served router's rows moved with the experts (the same function, other ids)."""


def expert_permutations(
    training: nn.Module, serving: nn.Module, layout: MoeLayout
) -> list[Permutation]:
    """Layers whose served experts match the training experts best in another order (each
    moved expert at least twice as close to its new partner as to its own slot)."""
    import torch

    out = []
    for block in layout.blocks:
        t = _expert_rows(training, block, layout.num_experts)
        s = _expert_rows(serving, block, layout.num_experts)
        if t is None or s is None or t.shape != s.shape:
            continue
        dist = torch.cdist(s, t) / t.norm(dim=1).clamp_min(1e-12)[None, :]  # (E_served, E_train)
        order = dist.argmin(dim=1)
        moved = [e for e in range(len(order)) if int(order[e]) != e]
        if not moved or len(set(order.tolist())) != len(order):
            continue
        if not all(float(dist[e, order[e]]) * 2 < float(dist[e, e]) for e in moved):
            continue
        rt = _weight(training, f"{block}.gate").detach().float()
        rs = _weight(serving, f"{block}.gate").detach().float()
        scale = float(rt.abs().max())
        follows = bool(torch.allclose(rs, rt[order], rtol=1e-2, atol=1e-6 + 1e-2 * scale))
        out.append(Permutation(block, tuple(int(i) for i in order), follows))
    return out


def missing_shared(
    train_norms: dict[str, float], serve_norms: dict[str, float], served_keys: set[str],
    training_keys: set[str],
) -> list[str]:
    """Shared experts the served copy lacks: its file holds none of the training file's
    tensors under the module, or its output is (near) zero where the training one's is not
    (mean output norms per module, from the routed forwards)."""
    out = []
    for name, norm in train_norms.items():
        stored = {k for k in training_keys if f"{name}." in k}
        absent = bool(stored) and not (stored & served_keys)
        silent = norm > 0 and serve_norms.get(name, 0.0) < 1e-3 * norm
        if absent or silent:
            out.append(name)
    return out
