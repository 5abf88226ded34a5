"""Layer-by-layer weights for models larger than memory (``precision.streaming``).

The model is built from its config.json with every parameter on the meta device
(shapes, no memory); buffers are built as usual. The streamed units are each
repeated layer (an element of the model's outermost ``ModuleList``: a decoder
or encoder layer) and each Embedding or Linear outside them (token embeddings,
output heads). A unit's weights are read from the files when it is called and
dropped when another unit is called or the model's forward returns, so one
unit's weights are in memory at a time (and a unit rerun alone as it returns
finds them loaded); the rest (final norms, small parameters) is read once. The
precision pass runs unchanged on such a model: a low-precision pass casts the meta placeholders
too, so every unit is read in the dtype its parameters hold at that moment,
and the numbers equal those of the in-memory pass. The price is I/O: every
forward reads the units again. Each tensor is read on its own through
``safetensors.safe_open(...).get_slice`` into fresh memory, the file opened for that
read only: no map held by a tensor keeps the pages read through it resident. The pass keeps its
per-layer tensors in a temporary file (:class:`~.spill.SpillFile`), so its
memory does not grow with depth either.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from paritygate.checkpoints import has_nonfinite
from paritygate.errors import InputError
from paritygate.precision.allocator import GLIBC
from paritygate.precision.hf import Coverage
from paritygate.precision.hooks import ParamSource, assign, read_from, release

AUTO_FRACTION = 0.5
"""``streaming: auto`` streams when the model's fp32 size exceeds this fraction of the
available memory (the in-memory pass peaks at up to twice the fp32 model)."""

_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
           "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
           "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
           "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}  # fmt: skip


@dataclass(frozen=True)
class Entry:
    """One tensor of a safetensors checkpoint, from the file header."""

    file: Path
    shape: tuple[int, ...]
    dtype: str
    nbytes: int


def checkpoint_index(files: Iterable[Path]) -> dict[str, Entry]:
    """Key -> file, shape and dtype, read from the safetensors headers only."""
    from safetensors import safe_open

    index: dict[str, Entry] = {}
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as handle:
                for key in handle.keys():  # noqa: SIM118 - a safe_open handle is no mapping
                    tensor = handle.get_slice(key)
                    shape, dtype = tuple(tensor.get_shape()), tensor.get_dtype()
                    known = _DTYPES.get(dtype)
                    size = math.prod(shape) * (known.itemsize if known is not None else 0)
                    index[key] = Entry(path, shape, dtype, size)
        except Exception as exc:  # OSError, or the reader's SafetensorError
            raise InputError(path, None, f"unreadable safetensors header: {exc}") from None
    return index


CHUNK_BYTES = 1 << 20
"""A tensor read into another dtype passes through a buffer of at most this size."""


def read_tensor(entry: Entry, key: str, as_dtype: torch.dtype | None = None) -> torch.Tensor:
    """One tensor read lazily from its file (``safe_open(...).get_slice``) into fresh memory.

    ``as_dtype``: a floating tensor converted while read, a slice of rows at a time (as a
    whole-tensor ``.to`` would round), so the stored dtype's full copy never exists beside
    the result. The file is open only while the tensor is read: no map outlives the call."""
    from safetensors import safe_open

    dtype = _DTYPES.get(entry.dtype)
    if dtype is None:
        raise InputError(entry.file, key, f"unsupported safetensors dtype {entry.dtype}")
    convert = as_dtype is not None and as_dtype != dtype and dtype.is_floating_point
    try:
        with safe_open(str(entry.file), framework="pt") as handle:
            tensor = handle.get_slice(key)
            if not convert or not entry.shape:
                value = tensor[...] if entry.shape else handle.get_tensor(key)
                return value.to(as_dtype) if convert else value
            value = torch.empty(entry.shape, dtype=as_dtype)
            row = max(math.prod(entry.shape[1:]) * dtype.itemsize, 1)
            step = max(CHUNK_BYTES // row, 1)
            for start in range(0, entry.shape[0], step):
                value[start : start + step].copy_(tensor[start : start + step])
            return value
    except InputError:
        raise
    except Exception as exc:
        raise InputError(entry.file, key, f"unreadable tensor: {exc}") from None


def fp32_bytes(index: dict[str, Entry]) -> int:
    """Size of the checkpoint's tensors once loaded in fp32 (floating tensors at 4 bytes)."""
    total = 0
    for entry in index.values():
        dtype = _DTYPES.get(entry.dtype)
        floating = dtype is not None and dtype.is_floating_point
        total += entry.nbytes * 4 // dtype.itemsize if floating else entry.nbytes  # type: ignore[union-attr]
    return total


def available_memory() -> int:
    """Bytes of memory available to a new allocation (MemAvailable on Linux)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def stream_decision(setting: bool | Literal["auto"], files: list[Path]) -> tuple[bool, str]:
    """Whether to stream, and the sentence the report carries when it does."""
    if setting is False:
        return False, ""
    size = fp32_bytes(checkpoint_index(files))
    if setting is True:
        return True, f"precision.streaming: true ({size / 2**20:.0f} MiB in fp32)"
    free = available_memory()
    stream = size > AUTO_FRACTION * free
    return stream, (
        f"precision.streaming: auto, the model's {size / 2**20:.0f} MiB in fp32 exceed "
        f"{AUTO_FRACTION:g} x the {free / 2**20:.0f} MiB of available memory"
    )


@contextlib.contextmanager
def params_on_meta() -> Iterator[None]:
    """Build modules with every parameter on the meta device (buffers as usual)."""
    original = nn.Module.register_parameter

    def register(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and not param.is_meta:
            param = nn.Parameter(param.detach().to("meta"), requires_grad=param.requires_grad)
        original(module, name, param)

    nn.Module.register_parameter = register  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


def repeated_layers(model: nn.Module) -> list[nn.Module]:
    """Elements with parameters of the model's outermost ``ModuleList``s (its layers)."""
    found: list[nn.Module] = []
    lists: list[str] = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.ModuleList):
            continue
        if any(name.startswith(outer + ".") for outer in lists):
            continue
        lists.append(name)
        found.extend(m for m in module if any(True for _ in m.parameters()))
    return found


def outer_leaves(model: nn.Module, layers: list[nn.Module]) -> list[nn.Module]:
    """Embedding and Linear modules outside the layers (token embeddings, output heads).

    Their forwards touch only their own weights, so they can be streamed like a layer; for a
    large-vocabulary LM they outweigh any one layer.
    """
    inside = {id(m) for layer in layers for m in layer.modules()}
    return [
        m
        for m in model.modules()
        if id(m) not in inside
        and isinstance(m, (nn.Embedding, nn.Linear))
        and not any(True for _ in m.children())
    ]


def _unique(params: Iterable[nn.Parameter]) -> list[nn.Parameter]:
    seen: dict[int, nn.Parameter] = {}
    for p in params:
        seen.setdefault(id(p), p)
    return list(seen.values())


class LayerStreamer(ParamSource):
    """Reads each repeated layer's parameters from the safetensors when the layer is called."""

    def __init__(self, model: nn.Module, index: dict[str, Entry]) -> None:
        self.model = model
        self.index = index
        prefix = getattr(model, "base_model_prefix", "") or ""
        self.keys: dict[int, str] = {}
        self.coverage = Coverage(checkpoint_tensors=len(index))
        used: set[str] = set()

        def key_of(name: str) -> str | None:
            names = [name, f"{prefix}.{name}"] if prefix else [name]
            if prefix and name.startswith(prefix + "."):
                names.append(name[len(prefix) + 1 :])
            return next((n for n in names if n in index), None)

        for name, p in model.named_parameters(remove_duplicate=False):
            if id(p) in self.keys:
                self.coverage.tied.append(name)
                continue
            key = key_of(name)
            if key is None:
                self.coverage.random_init.append(name)
                continue
            self.keys[id(p)] = key
            used.add(key)
        persistent = set(model.state_dict(keep_vars=True))
        self.buffers: list[tuple[nn.Module, str, str]] = []
        for name, _ in model.named_buffers(remove_duplicate=False):
            key = key_of(name)
            if key is not None:
                used.add(key)
                if name in persistent:
                    owner, _, attr = name.rpartition(".")
                    self.buffers.append((model.get_submodule(owner), attr, key))
            elif name in persistent:
                self.coverage.random_init.append(name)
        self.coverage.unused = sorted(k for k in index if k not in used)
        self.coverage.random_init.sort()
        self.layers = repeated_layers(model)
        self.outer = outer_leaves(model, self.layers)
        self.units = [*self.layers, *self.outer]
        """Streamed modules: the layers, then embeddings and heads outside them."""
        unit_of = {id(m): i for i, m in enumerate(self.units)}
        prefixes = sorted(  # longest first: a unit nested in another module's name
            [(f"{name}.", unit_of[id(m)]) for name, m in model.named_modules() if id(m) in unit_of],
            key=lambda item: -len(item[0]),
        )
        owners: dict[int, set[int | None]] = {}  # parameter -> units that use it (None: none)
        for name, p in model.named_parameters(remove_duplicate=False):
            unit = next((i for prefix, i in prefixes if name.startswith(prefix)), None)
            owners.setdefault(id(p), set()).add(unit)
        streamable = {pid for pid, units in owners.items() if None not in units}
        self.streamed: list[list[nn.Parameter]] = [
            [p for p in _unique(unit.parameters()) if id(p) in streamable and id(p) in self.keys]
            for unit in self.units
        ]
        self._streamed_ids = {id(q) for params in self.streamed for q in params}
        # a module rerun in low precision inside a loaded unit reads its weights again in
        # that dtype instead of holding a cast copy beside them
        read_from(self, (m for unit in self.units for m in unit.modules()))
        self.resident = [
            p for p in _unique(model.parameters()) if id(p) not in self._streamed_ids
        ]
        self.largest_layer_bytes = max(
            (sum(p.numel() * 4 for p in params) for params in self.streamed), default=0
        )
        """fp32 bytes of the largest streamed unit (a layer, or an embedding or head)."""
        self.layer_of = {id(unit): i for i, unit in enumerate(self.units)}

    def materialise_resident(self) -> None:
        """Read every parameter outside the streamed layers, and the persistent buffers."""
        self._read([p for p in self.resident if p.is_meta and id(p) in self.keys])
        for module, attr, key in self.buffers:
            module._buffers[attr] = read_tensor(self.index[key], key)

    def attach(self) -> None:
        """Register the pre-hooks that stream each unit in when it is called, and the model's
        hook that drops whatever is loaded when its forward returns.

        A unit stays loaded after it returns, until another unit is called (which drops it
        before reading itself) or the forward ends: one unit's weights at a time, and a
        measurement that reruns the unit as it returns finds it loaded, in the dtype of the
        run, instead of reading it again."""
        for unit in self.units:
            unit.register_forward_pre_hook(self._enter)
        self.model.register_forward_hook(self._leave)

    def _enter(self, layer: nn.Module, args: tuple[object, ...]) -> None:
        current = self.layer_of[id(layer)]
        mine = {id(p) for p in self.streamed[current]}  # a tied weight: read once, kept
        for i, params in enumerate(self.streamed):
            if i != current:
                for p in params:
                    if not p.is_meta and id(p) not in mine:
                        release(p)
        self._read([p for p in self.streamed[current] if p.is_meta])

    def _leave(self, model: nn.Module, args: tuple[object, ...], output: object) -> None:
        """Drop every loaded unit: the model's forward has returned."""
        for params in self.streamed:
            for p in params:
                if not p.is_meta:
                    release(p)
        GLIBC.release()

    def _read(self, params: list[nn.Parameter]) -> None:
        """Read ``params`` from their files in the dtype each placeholder holds."""
        for p in params:
            assign(p, self.read(p, p.dtype))

    def streams(self, p: nn.Parameter) -> bool:
        """Whether ``p`` is read from the files per call (a ParamSource)."""
        return id(p) in self._streamed_ids

    def read(self, p: nn.Parameter, dtype: torch.dtype) -> torch.Tensor:
        """``p``'s values from the file, in ``dtype`` (floating tensors) (a ParamSource)."""
        key = self.keys[id(p)]
        entry = self.index[key]
        if entry.shape != tuple(p.shape):
            shape = tuple(p.shape)
            raise InputError(entry.file, key, f"shape {entry.shape} does not fit {shape}")
        GLIBC.release()  # what the last read freed, before this one allocates
        return read_tensor(entry, key, dtype if p.is_floating_point() else None)

    def scan_nonfinite(self) -> list[str]:
        """Checkpoint keys holding NaN/Inf, read one tensor at a time."""
        bad = []
        for key, entry in self.index.items():
            value = read_tensor(entry, key)
            if has_nonfinite(value):
                bad.append(key)
        return bad




def build_streamed(
    model_class: Any, model_dir: Path, files: list[Path], trust_remote_code: bool = False
) -> tuple[nn.Module, LayerStreamer]:
    """The model of ``model_dir`` built on meta parameters, resident parts read, layers hooked."""
    import transformers

    from paritygate.engines.hf_loading import quiet_transformers

    try:
        config = transformers.AutoConfig.from_pretrained(
            model_dir, trust_remote_code=trust_remote_code
        )
        with quiet_transformers(), params_on_meta():
            if hasattr(model_class, "from_config"):
                model = model_class.from_config(
                    config, trust_remote_code=trust_remote_code, dtype=torch.float32
                )
            else:
                model = model_class._from_config(config, dtype=torch.float32)
    except Exception as exc:
        raise InputError(
            model_dir, "config.json", f"cannot build the model from its config: {exc}"
        ) from None
    model.eval()
    GLIBC.return_large_frees()
    streamer = LayerStreamer(model, checkpoint_index(files))
    streamer.materialise_resident()
    streamer.attach()
    return model, streamer


def streaming_note(streamer: LayerStreamer, reason: str) -> str:
    """The report's sentence on how the weights were read."""
    outer = f" and {len(streamer.outer)} embeddings and heads" if streamer.outer else ""
    return (
        f"weights streamed layer by layer from the safetensors ({reason}): "
        f"{len(streamer.layers)} layers{outer}, the largest "
        f"{streamer.largest_layer_bytes / 2**20:.1f} MiB in fp32; every forward reads them "
        "again, and the pass keeps its per-layer tensors in a temporary file"
    )
