"""Checkpoint tensors of a causal-LM model directory, read without running any code."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paritygate.checkpoints import has_nonfinite
from paritygate.engines.hf_loading import safetensors_files
from paritygate.reading import check_input


def read_state(directory: Path) -> dict[str, Any]:
    """Every tensor of a model directory's safetensors files (no code runs)."""
    from safetensors.torch import load_file

    state: dict[str, Any] = {}
    for path in safetensors_files(directory):
        check_input(path, None, what="safetensors file")
        state.update(load_file(str(path)))
    return state


@dataclass
class WeightsDiff:
    """Training vs served weights, tensor by tensor (training-only keys removed first).

    ``dtype_changes`` maps a key to ``(training dtype, served dtype)`` where the served copy
    stores another dtype; ``cast_exact`` lists those whose served values are exactly the
    training values cast to the served dtype (a pure precision change). ``value_diffs`` maps
    every differing key to its max abs diff (computed in float32 after that cast).
    """

    compared: int = 0
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    shape: dict[str, tuple[list[int], list[int]]] = field(default_factory=dict)
    dtype_changes: dict[str, tuple[str, str]] = field(default_factory=dict)
    cast_exact: list[str] = field(default_factory=list)
    value_diffs: dict[str, float] = field(default_factory=dict)
    nonfinite: list[str] = field(default_factory=list)
    untied: dict[str, str] = field(default_factory=dict)
    """Served keys the checkpoint stores as one tied tensor (``lm_head.weight`` of a
    ``tie_word_embeddings`` model), each mapped to the checkpoint key it is tied to; their
    values are compared with that tensor like any other (an equal copy is the same model)."""

    def served_dtypes(self) -> set[str]:
        """The lower dtypes the served copy stores (empty when none changed)."""
        return {served for _, served in self.dtype_changes.values()}


def _dtype_name(tensor: Any) -> str:
    return str(tensor.dtype).replace("torch.", "")


def is_training_only(key: str, heads: list[str]) -> bool:
    """``key`` belongs to a declared training-only head (prefix match, e.g. TRL's ``v_head.``)."""
    return any(key.startswith(h) for h in heads)


def tied_groups(model: Any) -> list[list[str]]:
    """Parameter names that share one tensor in ``model`` (tied weights), one list per tensor
    with two or more names."""
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    return [group for group in names.values() if len(group) > 1]


def compare_states(
    training: dict[str, Any],
    served: dict[str, Any],
    training_only: list[str],
    tied: Sequence[Sequence[str]] = (),
) -> WeightsDiff:
    """Compare every tensor the served copy should hold with the training checkpoint's.

    ``tied``: name groups that are one tensor in the training model (:func:`tied_groups`). A
    served key the checkpoint lacks but that is tied there to a checkpoint key is compared with
    that key's tensor instead of counting as extra.
    """
    import torch

    def keep(key: str) -> bool:
        return not is_training_only(key, training_only)

    train = {k: v for k, v in training.items() if keep(k)}
    serve = {k: v for k, v in served.items() if keep(k)}
    diff = WeightsDiff()
    diff.missing = sorted(set(train) - set(serve))
    pairs = [(k, k) for k in sorted(set(train) & set(serve))]
    for key in sorted(set(serve) - set(train)):
        source = next((n for g in tied if key in g for n in g if n in train), None)
        if source is None:
            diff.extra.append(key)
        else:
            diff.untied[key] = source
            pairs.append((source, key))
    for source, key in pairs:
        t, s = train[source], serve[key]
        diff.compared += 1
        if tuple(t.shape) != tuple(s.shape):
            diff.shape[key] = (list(t.shape), list(s.shape))
            continue
        if has_nonfinite(s):
            diff.nonfinite.append(key)
        expected = t
        if t.dtype != s.dtype:
            diff.dtype_changes[key] = (_dtype_name(t), _dtype_name(s))
            expected = t.to(s.dtype)
        if torch.equal(expected, s):
            if t.dtype != s.dtype:
                diff.cast_exact.append(key)
            continue
        if s.is_floating_point() or t.is_floating_point():
            delta = (expected.float() - s.float()).abs()
            diff.value_diffs[key] = float(torch.nan_to_num(delta, nan=float("inf")).max())
        else:
            diff.value_diffs[key] = float((expected.long() - s.long()).abs().max())
    return diff
