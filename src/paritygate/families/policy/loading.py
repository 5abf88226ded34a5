"""Checkpoint tensors into a policy model, with every discrepancy reported.

The model's own ``load_state_dict`` is used, but the report is computed
independently of it: missing, unexpected, shape, dtype and value mismatches,
and tied parameters. A checkpoint that stores one tensor under several names (SB3's
shared features extractor under ``features_extractor``, ``pi_features_extractor`` and
``vf_features_extractor``; tied weights) is judged by identity: a name the model lacks whose
tensor is one the model loads under another name is an alias, not an unexpected key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from paritygate.checkpoints import find_aliases

if TYPE_CHECKING:
    from torch import Tensor, nn


@dataclass
class LoadReport:
    """How a state dict landed in a model, computed independently of the model's own loader."""

    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    shape_mismatch: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)
    dtype_mismatch: list[tuple[str, str, str]] = field(default_factory=list)
    value_mismatch: list[str] = field(default_factory=list)
    tied: list[str] = field(default_factory=list)
    aliases: dict[str, str] = field(default_factory=dict)
    """Checkpoint names the model lacks -> the loaded name holding the same tensor."""
    load_error: str | None = None


def _lossless_upcast(tensor: Tensor, target: Tensor) -> bool:
    """A float tensor loaded into a wider float (fp16/bf16 file -> fp32 model) keeps its values;
    any other dtype change (float64 -> float32, fp16 -> bf16, int <-> float) does not."""
    return (
        tensor.is_floating_point()
        and target.is_floating_point()
        and target.element_size() > tensor.element_size()
    )


def load_into(
    model: nn.Module, state: dict[str, Tensor], *, ignore_prefixes: tuple[str, ...] = ()
) -> LoadReport:
    """Load ``state`` into ``model`` non-strictly and report every discrepancy.

    Keys under ``ignore_prefixes`` (declared training-only heads) are not
    "unexpected". Tensors with the wrong shape are not loaded (they would raise).
    After loading, every model tensor is compared with the file's, which catches
    loaders or hooks that silently drop or alter weights.
    """
    import torch

    from paritygate.metrics import same_tensor

    report = LoadReport()
    model_state = model.state_dict(keep_vars=True)
    owners: dict[int, str] = {}
    for name, tensor in model_state.items():
        ptr = tensor.data_ptr() if isinstance(tensor, torch.Tensor) and tensor.numel() else None
        if ptr is not None and ptr in owners and name not in state:
            report.tied.append(f"{name} (tied to {owners[ptr]})")
        elif ptr is not None:
            owners.setdefault(ptr, name)
    tied_names = {t.split(" ")[0] for t in report.tied}
    loadable: dict[str, Tensor] = {}
    for name, tensor in state.items():
        if name not in model_state:
            if not any(name == p or name.startswith(p + ".") for p in ignore_prefixes):
                report.unexpected.append(name)
            continue
        target = model_state[name]
        if tuple(target.shape) != tuple(tensor.shape):
            report.shape_mismatch.append((name, tuple(tensor.shape), tuple(target.shape)))
            continue
        if target.dtype != tensor.dtype and not _lossless_upcast(tensor, target):
            report.dtype_mismatch.append((name, str(tensor.dtype), str(target.dtype)))
        loadable[name] = tensor
    report.aliases = find_aliases(state, set(loadable))
    # sorted: a file's key order is not stable between processes, a report's order should be
    report.unexpected = sorted(n for n in report.unexpected if n not in report.aliases)
    report.missing = [n for n in model_state if n not in state and n not in tied_names]
    try:
        model.load_state_dict(loadable, strict=False)
    except Exception as exc:  # a custom loader that raises is reported by the check
        report.load_error = f"{type(exc).__name__}: {exc}"
    after = model.state_dict()
    for name, tensor in loadable.items():
        got = after.get(name)
        if (
            got is None
            or got.shape != tensor.shape
            or not same_tensor(got.detach().to(tensor.dtype), tensor)
        ):
            report.value_mismatch.append(name)
    return report

