"""Checkpoint tensors of a causal-LM model directory, read without running any code."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from paritygate.checkpoints import has_nonfinite
from paritygate.engines.hf_loading import safetensors_files
from paritygate.reading import check_input

if TYPE_CHECKING:
    from torch import Tensor, nn

    from paritygate.families.causal_lm.adapter import AdapterInfo


def read_state(directory: Path) -> dict[str, Tensor]:
    """Every tensor of a model directory's safetensors files (no code runs)."""
    from safetensors.torch import load_file

    state: dict[str, Tensor] = {}
    for path in safetensors_files(directory):
        check_input(path, None, what="safetensors file")
        state.update(load_file(str(path)))
    return state


def read_keys(directory: Path, keys: Sequence[str]) -> dict[str, Tensor]:
    """The tensors ``keys`` of a model directory's safetensors files (those it holds)."""
    from safetensors import safe_open

    wanted, state = set(keys), {}
    for path in safetensors_files(directory):
        check_input(path, None, what="safetensors file")
        with safe_open(str(path), "pt") as handle:
            for key in wanted & set(handle.keys()):
                state[key] = handle.get_tensor(key)
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
    low_rank: dict[str, int] = field(default_factory=dict)
    """Each differing key's numerical rank of (served - checkpoint), filled only when every
    differing tensor is an attention/MLP projection weight whose difference has low rank
    (:func:`adapter_ranks`): the signature of a low-rank adapter merged otherwise."""

    def adapter_modules(self) -> list[str]:
        """The projection modules a low-rank update touches (``q_proj``, ``v_proj``), sorted."""
        return sorted({projection_module(k) or k for k in self.low_rank})

    def served_dtypes(self) -> set[str]:
        """The lower dtypes the served copy stores (empty when none changed)."""
        return {served for _, served in self.dtype_changes.values()}


ADAPTER_MAX_RANK = 64
"""The highest difference rank read as an adapter's (LoRA ranks are 4-64 in practice), and never
above a quarter of the tensor's smaller side: a full-rank change is another checkpoint's."""
RANK_RTOL = 1e-2
"""A difference has rank r when its best rank-r approximation leaves under 1% of its Frobenius
norm: the rounding of fp32 merged weights (~6e-8 relative) stays far below, while a full-rank
change (another optimiser step) leaves most of its norm outside any small rank."""
_PROJECTIONS = ("query_key_value", "c_attn", "c_fc", "fc1", "fc2", "dense", "dense_h_to_4h",
                "dense_4h_to_h", "wqkv", "query", "key", "value", "wq", "wk", "wv", "wo", "w1",
                "w2", "w3")


def projection_module(key: str) -> str | None:
    """The module name of an attention/MLP projection weight (``q_proj`` of
    ``model.layers.0.self_attn.q_proj.weight``), or ``None`` for any other tensor (embeddings,
    norms, biases, the LM head)."""
    parts = key.split(".")
    if len(parts) < 2 or parts[-1] != "weight":
        return None
    module = parts[-2]
    return module if module.endswith("proj") or module.lower() in _PROJECTIONS else None


def difference_rank(reference: Tensor, candidate: Tensor) -> int | None:
    """Numerical rank of ``candidate - reference`` (two 2-D tensors), or ``None`` when it is
    above :data:`ADAPTER_MAX_RANK` (or a quarter of the smaller side).

    A seeded randomized range finder (``max_rank + 8`` probes, float64) holds the cost at
    O(m n r) per tensor: the difference's energy outside the probed span must be under
    :data:`RANK_RTOL`, and its rank is the fewest singular values that leave no more."""
    import torch

    delta = candidate.double() - reference.double()  # (m, n)
    rows, cols = delta.shape
    limit = min(ADAPTER_MAX_RANK, min(rows, cols) // 4)
    total = float((delta * delta).sum())
    if not math.isfinite(total):
        return None
    if total == 0.0:
        return 0
    if limit < 1:
        return None
    gen = torch.Generator().manual_seed(0)
    probes = torch.randn(cols, min(limit + 8, cols), generator=gen, dtype=torch.float64)
    basis, _ = torch.linalg.qr(delta @ probes)  # (m, k)
    energy = torch.linalg.svdvals(basis.T @ delta) ** 2  # (k,), largest first
    allowed = RANK_RTOL**2 * total
    if total - float(energy.sum()) > allowed:
        return None
    left = total - torch.cumsum(energy, 0)  # energy outside the top 1, 2, ... values
    rank = int((left > allowed).sum()) + 1
    return rank if rank <= limit else None


def adapter_ranks(training: dict[str, Tensor], served: dict[str, Tensor], keys: list[str],
                  ) -> dict[str, int]:
    """Each key's difference rank when every one of ``keys`` is a projection weight whose
    served value differs from the training value by a low-rank update; else empty. Stops at
    the first key that is not, so a stale checkpoint costs one rank estimate at most."""
    if not keys or any(projection_module(k) is None for k in keys):
        return {}
    ranks: dict[str, int] = {}
    for key in keys:
        t, s = training[key], served[key]
        if t.dim() != 2:
            return {}
        rank = difference_rank(t.to(s.dtype), s)
        if rank is None:
            return {}
        ranks[key] = rank
    return ranks


def _dtype_name(tensor: Tensor) -> str:
    return str(tensor.dtype).replace("torch.", "")


def is_training_only(key: str, heads: list[str]) -> bool:
    """``key`` belongs to a declared training-only head (prefix match, e.g. TRL's ``v_head.``)."""
    return any(key.startswith(h) for h in heads)


def tied_groups(model: nn.Module) -> list[list[str]]:
    """Parameter names that share one tensor in ``model`` (tied weights), one list per tensor
    with two or more names."""
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    return [group for group in names.values() if len(group) > 1]


def compare_states(
    training: dict[str, Tensor],
    served: dict[str, Tensor],
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
    if not diff.missing and not diff.extra and not diff.shape and not diff.untied:
        diff.low_rank = adapter_ranks(train, serve, sorted(diff.value_diffs))
    return diff


def _rounding(served: Tensor, merged: Tensor) -> float:
    """The relative rounding of ``served``'s dtype when it is a lower float precision than
    ``merged``'s (bf16: 2**-7), else 0."""
    import torch

    if not served.is_floating_point() or not merged.is_floating_point():
        return 0.0
    eps = float(torch.finfo(served.dtype).eps)
    return eps if eps > float(torch.finfo(merged.dtype).eps) else 0.0


ADAPTER_RTOL = 1e-2
"""How close served - base must come to c * (merged - base), relative to its own norm, to be
read as the adapter's update at another scale (fp32 merges leave ~1e-7; another adapter
leaves most of the norm). A served copy in a lower precision adds its rounding to that."""


@dataclass(frozen=True)
class AdapterFit:
    """How the served copy's adapter tensors relate to the base and the merged policy:
    ``kind`` is ``adapter_not_merged`` (served = base), ``adapter_scale_differs`` (served - base
    = ``scale`` x (merged - base), ``scale`` != 1), ``adapter_mismatch`` (another update), or
    ``merged_in_served_dtype``: served = merged within the rounding of merging in the served
    lower precision (peft on a bf16 base), not a fault: the precision tier judges it."""

    kind: str
    scale: float
    """The least-squares c of served - base = c (merged - base) over every target tensor."""
    residual: float
    """||served - base - c (merged - base)|| / ||served - base|| (0 when served = base)."""
    tensors: int


def adapter_fit(base: dict[str, Tensor], merged: dict[str, Tensor], served: dict[str, Tensor],
                differing: Sequence[str]) -> AdapterFit | None:
    """Name how the served copy merged the adapter, when every differing key is one of the
    adapter's target tensors (``base``'s keys); ``None`` when another tensor differs too (not
    an adapter fault) or the adapter changes nothing.

    With U = merged - base and S = served - base, c = <S, U> / <U, U>. A lower-precision
    served copy carries rounding noise R (each element within eps x (|merged| + |base|)),
    uncorrelated with U: it moves c by about ||R|| / ||U|| and is allowed in the residual."""
    if not differing or any(k not in base for k in differing):
        return None
    dot = upd = srv = floor = 0.0
    within = True
    pairs = []
    for key in sorted(base):
        if key not in merged or key not in served:
            return None
        b, m = base[key].double(), merged[key].double()
        update = m - b  # the adapter's merged update
        change = served[key].double() - b  # what the served copy applied
        pairs.append((update, change))
        dot += float((update * change).sum())
        upd += float((update * update).sum())
        srv += float((change * change).sum())
        eps = _rounding(served[key], merged[key])
        bound = eps * (m.abs() + b.abs())
        floor += float((bound * bound).sum()) / 3  # uniform rounding within the bound
        within = within and bool(((change - update).abs() <= bound).all())
    if upd == 0.0 or not math.isfinite(dot + upd + srv + floor):
        return None
    scale = dot / upd
    spread = max(0.05, 3 * math.sqrt(floor / upd))  # how far rounding alone moves c
    if floor > 0 and within and abs(scale - 1) <= spread:
        return AdapterFit("merged_in_served_dtype", scale, 0.0, len(pairs))
    if srv <= ADAPTER_RTOL**2 * upd + 4 * floor and abs(scale) <= spread:
        return AdapterFit("adapter_not_merged", 0.0, 0.0, len(pairs))
    left = sum(float(((c - scale * u) ** 2).sum()) for u, c in pairs)
    residual = math.sqrt(left / srv) if srv else 0.0
    fits = left <= ADAPTER_RTOL**2 * srv + 4 * floor
    return AdapterFit("adapter_scale_differs" if fits else "adapter_mismatch", scale, residual,
                      len(pairs))


OTHER_BASE_SIGMAS = 8.0
"""How many standard errors c must stand clear of 0 to say the adapter's update is in the
served copy (a served copy unrelated to the adapter gives c within a few standard errors)."""


@dataclass(frozen=True)
class OtherBase:
    """The adapter's update found in a served copy whose other tensors differ from the base:
    served - base = c x (merged - base) + R on the target tensors, c near 1, R the other
    base's own difference (of the size the non-target tensors show)."""

    scale: float
    """The least-squares c over the adapter's target tensors."""
    stderr: float
    """c's standard error if R is unrelated to the update: ||R|| / (sqrt(n) ||U||)."""
    tensors: int


def update_on_other_base(base: dict[str, Tensor], merged: dict[str, Tensor],
                         served: dict[str, Tensor]) -> OtherBase | None:
    """Whether the served copy holds the adapter's update U = merged - base on its target
    tensors over weights that are not ``base``'s (the adapter merged onto another base): c of
    served - base = c U is within 0.1 (or 4 standard errors) of 1 and clear of 0 by
    :data:`OTHER_BASE_SIGMAS` standard errors; ``None`` otherwise (another checkpoint)."""
    dot = upd = 0.0
    pairs = []
    for key in sorted(base):
        if key not in merged or key not in served or served[key].shape != base[key].shape:
            return None
        b = base[key].double()
        update, change = merged[key].double() - b, served[key].double() - b
        pairs.append((update, change))
        dot += float((update * change).sum())
        upd += float((update * update).sum())
    if not pairs or upd == 0.0 or not math.isfinite(dot + upd):
        return None
    scale = dot / upd
    left = sum(float(((c - scale * u) ** 2).sum()) for u, c in pairs)
    count = sum(u.numel() for u, _ in pairs)
    stderr = math.sqrt(left / count) / math.sqrt(upd)
    if not math.isfinite(stderr) or abs(scale) < OTHER_BASE_SIGMAS * stderr:
        return None
    if abs(scale - 1.0) > max(0.1, 4 * stderr):
        return None
    return OtherBase(scale, stderr, len(pairs))


@dataclass(frozen=True)
class AdapterServed:
    """How a served copy holds the declared adapter: ``fit`` when only its target tensors
    differ (:func:`adapter_fit`), ``other_base`` when other tensors differ too and the targets
    hold its update over them (:func:`update_on_other_base`), ``named_base`` the adapter's
    ``base_model_name_or_path`` when it names another base than ``model_dir``."""

    fit: AdapterFit | None
    other_base: OtherBase | None
    named_base: str | None


def how_served(adapter: AdapterInfo, model_dir: Path, base: dict[str, Tensor],
               training: Mapping[str, Tensor], served: Mapping[str, Tensor],
               differing: Sequence[str]) -> AdapterServed | None:
    """The served copy read against the base and the merged policy on the adapter's target
    tensors (``base``); ``None`` when the adapter changes nothing the files hold."""
    from paritygate.families.causal_lm.adapter import local_base

    if not base:
        return None
    merged = {k: training[k] for k in base if k in training}
    on_targets = {k: served[k] for k in base if k in served}
    fit = adapter_fit(base, merged, on_targets, differing)
    others = [k for k in differing if k not in base]
    other = update_on_other_base(base, merged, on_targets) if others else None
    named = local_base(adapter)
    said = adapter.base_name if adapter.base_name is not None and (
        named is None or named.resolve() != model_dir.resolve()) else None
    return AdapterServed(fit, other, said)
