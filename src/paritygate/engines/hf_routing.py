"""MoE layers of a Hugging Face causal LM: where the routers are, and what they chose.

transformers (5.x) builds every sparse block it ships for causal LMs (Qwen2-MoE, Qwen3-MoE,
Mixtral, OLMoE, and the classes that reuse them) as a module with a ``gate`` (the router,
returning ``(router_logits, routing_weights, expert_ids)``) beside ``experts`` (fused
``gate_up_proj`` / ``down_proj`` tensors), and Qwen2-MoE adds a ``shared_expert``. A router
that returns its logits only (an ``nn.Linear`` gate, older classes) gets its top-k from the
config (``num_experts_per_tok``, softmax then top-k, renormalised under ``norm_topk_prob``).
None of these classes drops tokens at a capacity limit (every token reaches its k experts),
so there is no capacity to compare.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    import numpy as np
    from torch import Tensor, nn


@dataclass(frozen=True)
class MoeLayout:
    """The MoE layers of a model, from its modules and its config."""

    blocks: tuple[str, ...]
    """Sparse block module names (``model.layers.0.mlp``), in layer order."""
    num_experts: int
    top_k: int
    norm_topk_prob: bool | None
    """``None``: the class always renormalises (Mixtral) or the config does not say."""
    shared: tuple[str, ...] = ()
    """Shared-expert module names (Qwen2-MoE), empty when the class has none."""

    @property
    def routers(self) -> tuple[str, ...]:
        return tuple(f"{b}.gate" for b in self.blocks)


def moe_layout(model: nn.Module) -> MoeLayout | None:
    """The model's MoE layout, or ``None`` for a dense model (no block with a ``gate`` router
    beside ``experts``)."""
    blocks, shared = [], []
    for name, module in model.named_modules():
        if hasattr(module, "gate") and hasattr(module, "experts"):
            blocks.append(name)
            if hasattr(module, "shared_expert"):
                shared.append(f"{name}.shared_expert")
    if not blocks:
        return None
    config = getattr(model, "config", None)
    experts = (getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
               or getattr(model.get_submodule(blocks[0]).gate, "num_experts", 0))
    top_k = (getattr(config, "num_experts_per_tok", None)
             or getattr(model.get_submodule(blocks[0]).gate, "top_k", 0))
    norm = getattr(config, "norm_topk_prob", None)
    return MoeLayout(tuple(blocks), int(experts or 0), int(top_k or 0),
                     None if norm is None else bool(norm), tuple(shared))


@dataclass
class RouterCapture:
    """What each router chose on every forward run inside :func:`capture_routing`: per router
    module name, chunks of ``logits`` ``(N, E)``, ``experts`` ``(N, K)`` and ``weights``
    ``(N, K)``, one chunk per forward (all token positions of the batch, padding included)."""

    layout: MoeLayout
    logits: dict[str, list[Tensor]] = field(default_factory=dict)
    experts: dict[str, list[Tensor]] = field(default_factory=dict)
    weights: dict[str, list[Tensor]] = field(default_factory=dict)
    shared_norm: dict[str, list[Tensor]] = field(default_factory=dict)
    """Per shared expert: the L2 norm of its output per token."""

    def layer(self, router: str, keep: Tensor) -> dict[str, np.ndarray]:
        """One router's arrays over the kept token positions (``keep`` flattened like the
        captured chunks, bool)."""
        import torch

        out = {}
        for name, store in (("logits", self.logits), ("experts", self.experts),
                            ("weights", self.weights)):
            cat = torch.cat(store[router])
            out[name] = cat[keep].float().numpy() if cat.is_floating_point() \
                else cat[keep].numpy()
        return out


def _routed(layout: MoeLayout, logits: Tensor) -> tuple[Tensor, Tensor]:
    """Top-k of a router that returns logits only, by the config's rule."""
    import torch

    probs = torch.softmax(logits.float(), dim=-1)
    weights, experts = torch.topk(probs, layout.top_k, dim=-1)
    if layout.norm_topk_prob is not False:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, experts


@contextmanager
def capture_routing(model: nn.Module, layout: MoeLayout) -> Iterator[RouterCapture]:
    """Forward hooks on every router (and shared expert) of ``model`` while the block runs."""
    import torch

    capture = RouterCapture(layout)
    handles = []

    def on_router(name: str) -> Callable[[object, object, object], None]:
        def hook(_module: object, _inputs: object, output: object) -> None:
            if isinstance(output, tuple) and len(output) >= 3:
                logits, weights, experts = output[0], output[1], output[2]
            else:
                logits = output[0] if isinstance(output, tuple) else output
                assert isinstance(logits, torch.Tensor)
                weights, experts = _routed(layout, logits)
            logits = logits.reshape(-1, logits.shape[-1])
            capture.logits.setdefault(name, []).append(logits.detach().float().cpu())
            capture.experts.setdefault(name, []).append(
                experts.reshape(logits.shape[0], -1).detach().to(torch.int64).cpu())
            capture.weights.setdefault(name, []).append(
                weights.reshape(logits.shape[0], -1).detach().float().cpu())
        return hook

    def on_shared(name: str) -> Callable[[object, object, object], None]:
        def hook(_module: object, _inputs: object, output: object) -> None:
            out = output[0] if isinstance(output, tuple) else output
            assert isinstance(out, torch.Tensor)
            norm = out.detach().float().reshape(-1, out.shape[-1]).norm(dim=-1).cpu()
            capture.shared_norm.setdefault(name, []).append(norm)
        return hook

    try:
        for name in layout.routers:
            handles.append(model.get_submodule(name).register_forward_hook(on_router(name)))
        for name in layout.shared:
            handles.append(model.get_submodule(name).register_forward_hook(on_shared(name)))
        yield capture
    finally:
        for handle in handles:
            handle.remove()


def routed_forward(
    model: nn.Module, layout: MoeLayout, sequences: Sequence[Sequence[int]], pad_id: int,
    batch_size: int = 8,
) -> tuple[RouterCapture, Tensor]:
    """Teacher-forced forwards of ``model`` over ``sequences`` (left-padded, no cache) with
    router hooks: the capture and the flattened bool mask of real token positions, in the
    captured order (batch by batch, row-major)."""
    import torch

    from paritygate.engines.generation import left_pad

    masks = []
    with capture_routing(model, layout) as capture, torch.inference_mode():
        for start in range(0, len(sequences), batch_size):
            chunk = [list(s) for s in sequences[start : start + batch_size]]
            ids, mask = left_pad(chunk, pad_id)  # (B, T)
            positions_ = (mask.cumsum(dim=-1) - 1).clamp(min=0)  # left padding shifts nothing
            model(input_ids=ids, attention_mask=mask, use_cache=False, position_ids=positions_)
            masks.append(mask.reshape(-1).bool())
    return capture, torch.cat(masks)


def positions(sequences: Sequence[Sequence[int]], batch_size: int = 8) -> list[list[int]]:
    """For each sequence, the flat indices of its tokens in :func:`routed_forward`'s capture
    (left padding: a row's tokens sit at its end)."""
    out: list[list[int]] = []
    offset = 0
    for start in range(0, len(sequences), batch_size):
        chunk = sequences[start : start + batch_size]
        width = max(len(s) for s in chunk)
        for row, seq in enumerate(chunk):
            first = offset + row * width + (width - len(seq))
            out.append(list(range(first, first + len(seq))))
        offset += len(chunk) * width
    return out
