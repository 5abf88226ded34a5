"""Checkpoint loading that never runs code from the checkpoint.

Formats: safetensors; torch files through ``torch.load(weights_only=True)``;
Stable-Baselines3 zips (their ``policy.pth`` member, loaded the same way).
Anything that needs arbitrary unpickling is refused unless the config opts in
with ``allow_pickle: true``.
"""

from __future__ import annotations

import io
import pickle
import warnings
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from paritygate.errors import InputError, MissingExtra
from paritygate.reading import check_input, read_zip_member

if TYPE_CHECKING:
    from types import ModuleType

    import torch

PICKLE_REFUSED = (
    "needs arbitrary unpickling, which can run code from the file; refused "
    "(save it with safetensors, or set allow_pickle: true to opt in)"
)


def _torch() -> ModuleType:
    try:
        import torch
    except ImportError:
        raise MissingExtra("torch", "torch") from None
    return torch


def has_nonfinite(t: torch.Tensor) -> bool:
    """Whether a tensor holds NaN or +-Inf.

    Its sum is taken first: one reduction, non-finite whenever any value is. Only a non-finite
    sum (which finite values can also give, by overflow) is followed by the exact check. On a
    30522x384 embedding table that is 2 ms instead of 60 ms for ``isfinite(t).all()``.
    """
    if not t.is_floating_point() or t.numel() == 0:
        return False
    torch = _torch()
    try:
        total = t.sum(dtype=torch.float64 if t.dtype == torch.float64 else torch.float32)
        if bool(torch.isfinite(total)):
            return False
    except (RuntimeError, TypeError):  # a dtype without a sum kernel (float8): exact check
        pass
    return not bool(torch.isfinite(t).all())


def _looks_like_torch(source: str | BinaryIO) -> bool:
    """A torch file is a zip archive (torch >= 1.6) or starts with a pickle PROTO opcode."""
    if not isinstance(source, str):
        source.seek(0)
        head = source.read(4)
        source.seek(0)
    else:
        with open(source, "rb") as fh:
            head = fh.read(4)
    return head.startswith(b"PK") or head[:1] == b"\x80"


def _torch_load(source: str | BinaryIO, path: Path, key: str | None, allow_pickle: bool
                ) -> object:
    torch = _torch()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's notes on old pickle protocols: not ours
            return torch.load(source, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if "weights only" not in str(exc).lower() or not _looks_like_torch(source):
            raise InputError(
                path, key, "not a torch checkpoint (truncated or corrupt?): cannot unpickle it"
            ) from None
        if not allow_pickle:
            raise InputError(path, key, PICKLE_REFUSED) from None
        if not isinstance(source, str):
            source.seek(0)
        try:
            return torch.load(source, map_location="cpu", weights_only=False)
        except Exception as exc2:
            raise InputError(path, key, f"unreadable torch file: {exc2}") from exc
    except Exception as exc:  # any failure to parse the bytes (struct, EOF, zip, ...) is bad input
        raise InputError(
            path, key, f"unreadable torch file (truncated or corrupt?): {type(exc).__name__}: {exc}"
        ) from None


STATE_DICT_KEYS: tuple[str, ...] = (
    "state_dict", "model_state_dict", "model", "policy_state_dict", "policy", "actor_critic",
    "agent", "network", "net",
)
"""Keys a training checkpoint (``{"model": state_dict, "optimizer": ..., "step": N}``) commonly
keeps the model's state dict under, tried in this order when ``policy.state_dict_key`` is unset."""

STATE_DICT_KEY = "policy.state_dict_key"


def _is_state_dict(obj: object) -> bool:
    torch = _torch()
    return isinstance(obj, Mapping) and bool(obj) and all(
        isinstance(v, torch.Tensor) for v in obj.values())


def _top_keys(obj: Mapping[object, object]) -> str:
    names = [str(k) for k in obj]
    shown = ", ".join(names[:12]) + (f", ... ({len(names)} keys)" if len(names) > 12 else "")
    return f"top-level keys: {shown}"


def find_state_dict(
    obj: object, path: Path, key: str | None = None
) -> tuple[Mapping[object, object], str | None]:
    """The state dict inside a loaded checkpoint object and the dotted key it was found under.

    ``key`` (``policy.state_dict_key``, dotted for nesting: ``agent.actor``) picks it;
    without one, a flat mapping of tensors is the state dict itself (key ``None``) and a
    training checkpoint's state dict is found under one of :data:`STATE_DICT_KEYS`. A training
    checkpoint where none fits is an :class:`InputError` listing its top-level keys."""
    if key is not None:
        node = obj
        for depth, part in enumerate(key.split(".")):
            if not isinstance(node, Mapping) or part not in node:
                where = ".".join(key.split(".")[:depth])
                if not isinstance(node, Mapping):
                    have = f"{where} is a {type(node).__name__}"
                else:
                    have = _top_keys(node) if not where else _top_keys(node).replace(
                        "top-level keys", f"keys of {where}")
                raise InputError(path, STATE_DICT_KEY, f"{key!r} is not in the checkpoint "
                                 f"({have})")
            node = node[part]
        if not isinstance(node, Mapping) or not node:
            raise InputError(path, STATE_DICT_KEY, f"{key!r} holds a {type(node).__name__}, "
                             "not a state dict (a mapping of name -> tensor)")
        return node, key
    if not isinstance(obj, Mapping) or not obj:
        raise InputError(path, None, "checkpoint holds no state_dict (a mapping of name -> tensor)")
    if not any(isinstance(v, Mapping) for v in obj.values()):
        return obj, None  # flat: every value must be a tensor (checked by the caller)
    for name in STATE_DICT_KEYS:
        if _is_state_dict(obj.get(name)):
            return obj[name], name
    raise InputError(path, STATE_DICT_KEY, "a training checkpoint without a state dict under "
                     f"a common name ({', '.join(STATE_DICT_KEYS)}); {_top_keys(obj)}: set "
                     "policy.state_dict_key to the key that holds it (dotted when nested, e.g. "
                     "agent.actor)")


def nested_state_dict_keys(path: Path, *, allow_pickle: bool = False) -> list[str]:
    """Dotted keys of the mappings of tensors one or two levels down a training checkpoint
    (``agent.actor`` of ``{"agent": {"actor": sd}, "optim": ..., "global_step": N}``), the
    largest first: the candidates for ``policy.state_dict_key``."""
    check_input(path, None, what="checkpoint")
    obj = _torch_load(str(path), path, None, allow_pickle)
    found: list[tuple[int, str]] = []
    if isinstance(obj, Mapping):
        for name, value in obj.items():
            if _is_state_dict(value):
                found.append((len(value), str(name)))
            elif isinstance(value, Mapping):
                found += [(len(inner), f"{name}.{key}") for key, inner in value.items()
                          if _is_state_dict(inner)]
    return [key for _, key in sorted(found, key=lambda f: -f[0])]


def _as_state_dict(
    obj: object, path: Path, key: str | None = None
) -> tuple[dict[str, torch.Tensor], str | None]:
    _torch()  # MissingExtra without torch
    import torch

    found, where = find_state_dict(obj, path, key)
    out: dict[str, torch.Tensor] = {}
    for name, value in found.items():
        if not isinstance(value, torch.Tensor):
            prefix = f"{where}." if where else ""
            raise InputError(path, f"{prefix}{name}", f"not a tensor ({type(value).__name__})")
        out[str(name)] = value
    return out, where


def memory_bytes() -> int | None:
    """This machine's physical memory, where the platform says (``None`` elsewhere)."""
    import os

    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return None


def read_checkpoint(path: Path) -> tuple[bytes, str]:
    """The bytes of a checkpoint file and their sha256, from one read.

    A file larger than this machine's memory is refused before a byte is read: it is loaded
    whole, so it cannot be gated here, and hashing it first (a 100 GB sparse file) would
    take minutes before that became clear."""
    import hashlib

    check_input(path, None, what="checkpoint")  # no FIFO, device or sparse file
    size = path.stat().st_size
    limit = memory_bytes()
    if limit is not None and size > limit:
        raise InputError(path, None, f"checkpoint is {size / 2**30:.1f} GiB, more than this "
                                     f"machine's {limit / 2**30:.1f} GiB of memory; it is "
                                     "loaded whole, so it cannot be gated here")
    try:
        data = path.read_bytes()
    except MemoryError:
        raise InputError(path, None, f"checkpoint of {size / 2**30:.1f} GiB does not fit in "
                                     "memory") from None
    except OSError as exc:
        raise InputError(path, None, f"cannot read checkpoint: {exc.strerror}") from None
    return data, hashlib.sha256(data).hexdigest()


def load_state_dict(
    path: Path, *, allow_pickle: bool = False, data: bytes | None = None,
    state_dict_key: str | None = None,
) -> dict[str, torch.Tensor]:
    """Read a checkpoint file into ``{name: tensor}`` on the CPU, read-only.

    ``data``: the file's bytes, already read (:func:`read_checkpoint`), so the file is read
    once for its digest and its tensors. ``state_dict_key``: see :func:`find_state_dict`."""
    return load_checkpoint_state(path, allow_pickle=allow_pickle, data=data,
                                 state_dict_key=state_dict_key)[0]


def load_checkpoint_state(
    path: Path, *, allow_pickle: bool = False, data: bytes | None = None,
    state_dict_key: str | None = None,
) -> tuple[dict[str, torch.Tensor], str | None]:
    """:func:`load_state_dict`, and the dotted key of a training checkpoint the state dict was
    read from (``None``: the file is the state dict itself)."""
    if data is None:
        check_input(path, None, what="checkpoint")
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        try:
            from safetensors.torch import load, load_file
        except ImportError:
            raise MissingExtra("safetensors", "torch") from None
        try:
            loaded = load_file(str(path), device="cpu") if data is None else load(data)
        except Exception as exc:
            raise InputError(
                path, None, f"unreadable safetensors (truncated or corrupt?): {exc}"
            ) from None
        return _as_state_dict(loaded, path, state_dict_key)
    source: Path | io.BytesIO = path if data is None else io.BytesIO(data)
    if suffix == ".zip" and zipfile.is_zipfile(source):
        with zipfile.ZipFile(source) as zf:
            if "policy.pth" in zf.namelist():  # Stable-Baselines3 layout
                member = io.BytesIO(read_zip_member(zf, "policy.pth", path, None,
                                                    what="member", max_bytes=memory_bytes()))
                try:
                    unpickled = _torch_load(member, path, None, allow_pickle)
                except InputError as exc:  # the member is named in the cause, the key stays free
                    raise InputError(path, None, f"member policy.pth: {exc.cause}") from None
                return _as_state_dict(unpickled, path, state_dict_key)
    reread: str | io.BytesIO = str(path) if data is None else io.BytesIO(data)
    return _as_state_dict(_torch_load(reread, path, None, allow_pickle), path, state_dict_key)


def _storage(tensor: torch.Tensor) -> tuple[int, int, tuple[int, ...], tuple[int, ...]] | None:
    """Where a tensor's values live: the same storage, offset, shape and strides is the same
    tensor under another name."""
    try:
        ptr = tensor.untyped_storage().data_ptr()
    except (AttributeError, RuntimeError):
        return None
    if not tensor.numel() or not ptr:
        return None
    return ptr, int(tensor.storage_offset()), tuple(tensor.shape), tuple(tensor.stride())


def _suffix(name: str) -> str:
    return name.split(".", 1)[1] if "." in name else name


def find_aliases(state: Mapping[str, object], loaded: set[str], *, by_value: bool = True
                 ) -> dict[str, str]:
    """Checkpoint names outside ``loaded`` that store a tensor also stored under a loaded name:
    the same storage (a module registered under several names, saved once), or, in a file
    format that stores each name separately, equal non-constant values under the same name
    below their first part (``vf_features_extractor.cnn.0.weight`` equal to
    ``features_extractor.cnn.0.weight``; ``by_value=False``: storage only). ``{alias: loaded
    name}``."""
    import torch

    where: dict[tuple[int, int, tuple[int, ...], tuple[int, ...]], str] = {}
    by_suffix: dict[str, list[str]] = {}
    for name in sorted(loaded):
        tensor = state[name]
        if not isinstance(tensor, torch.Tensor):
            continue
        spot = _storage(tensor)
        if spot is not None:
            where.setdefault(spot, name)
        by_suffix.setdefault(_suffix(name), []).append(name)
    found: dict[str, str] = {}
    for name, tensor in state.items():
        if name in loaded or not isinstance(tensor, torch.Tensor):
            continue
        spot = _storage(tensor)
        if spot is not None and spot in where:
            found[name] = where[spot]
            continue
        if not by_value or "." not in name or tensor.numel() < 2:
            continue
        for other in sorted(by_suffix.get(_suffix(name), [])):
            ref = state[other]
            if (isinstance(ref, torch.Tensor) and ref.shape == tensor.shape
                    and ref.dtype == tensor.dtype and torch.equal(ref, tensor)
                    and bool((tensor != tensor.flatten()[0]).any())):
                found[name] = other
                break
    return found
