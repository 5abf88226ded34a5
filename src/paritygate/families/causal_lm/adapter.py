"""A PEFT adapter as the training side: a base model plus ``adapter_config.json`` and
``adapter_model.safetensors``, read and validated without running code, then loaded with the
real ``peft`` library and merged in memory (nothing is written).

The checks then compare the merged training policy against the served copy; ``weights_load``
names how a served copy differs on the adapter's target modules (:func:`adapter_fit` in
:mod:`~paritygate.families.causal_lm.weights`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paritygate.errors import InputError
from paritygate.reading import check_input
from paritygate.reading_text import read_json

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
"""The prefix peft saves adapter tensor names under (the base model's names follow it)."""
_LORA_PARTS = (".lora_A.", ".lora_B.", ".lora_embedding_A", ".lora_embedding_B",
               ".lora_magnitude_vector")


def is_adapter_dir(path: Path) -> bool:
    """``path`` is a directory holding a PEFT ``adapter_config.json``."""
    return path.is_dir() and (path / CONFIG_FILE).is_file()


@dataclass(frozen=True)
class AdapterInfo:
    """What the adapter's own files say: enough to name it in a report and to find the
    tensors it changes."""

    directory: Path
    peft_type: str
    base_name: str | None
    """``base_model_name_or_path`` (a local directory or a hub id; ``None`` when unset)."""
    r: int | None
    alpha: float | None
    fan_in_fan_out: bool
    shapes: dict[str, list[int]] = field(default_factory=dict)
    """Every adapter tensor's shape, by its saved name (read from the safetensors header)."""

    @property
    def scale(self) -> float | None:
        """The LoRA update's scale ``lora_alpha / r`` (``None`` when either is unset)."""
        return self.alpha / self.r if self.alpha is not None and self.r else None

    def target_weights(self) -> list[str]:
        """The base model's weight keys the merge changes (``...q_proj.weight``), sorted."""
        return sorted({_target(name) for name in self.shapes})

    def ranks(self) -> list[int]:
        """The LoRA ranks of the adapter's tensors (``lora_A``'s first dimension), sorted."""
        return sorted({shape[0] for name, shape in self.shapes.items()
                       if ".lora_A." in name and shape})

    def describe(self) -> str:
        scale = f", lora_alpha {self.alpha:g}, r {self.r}, scale {self.scale:g}" \
            if self.scale is not None and self.alpha is not None else ""
        modules = sorted({k.split(".")[-2] for k in self.target_weights() if "." in k})
        return (f"{self.peft_type} adapter {self.directory} ({len(self.target_weights())} "
                f"tensors of {', '.join(modules)}{scale})")


def read_adapter(directory: Path, key: str | None) -> AdapterInfo:
    """Validate an adapter directory (config JSON, safetensors weights) and read its header;
    bad input names the file and ``key``. A pickled ``adapter_model.bin`` is refused: the
    gate never unpickles."""
    check_input(directory, key, what="adapter directory", expect="dir")
    config_path = directory / CONFIG_FILE
    if not config_path.is_file():
        raise InputError(directory, key, f"not a PEFT adapter directory (no {CONFIG_FILE})")
    data = read_json(config_path, key, what="adapter config")
    if not isinstance(data, dict) or not isinstance(data.get("peft_type"), str):
        raise InputError(config_path, key, "adapter config has no peft_type")
    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        bin_note = " (adapter_model.bin is pickle, never loaded: save with safetensors)" \
            if (directory / "adapter_model.bin").exists() else ""
        raise InputError(directory, key, f"adapter directory has no {WEIGHTS_FILE}{bin_note}")
    check_input(weights, key, what="adapter weights")
    from safetensors import safe_open

    try:
        with safe_open(str(weights), "pt") as handle:
            names = list(handle.keys())
            shapes = {k: list(handle.get_slice(k).get_shape()) for k in names}
    except Exception as exc:  # a truncated or foreign file: bad input, not a crash
        raise InputError(weights, key, f"unreadable adapter weights: {exc}") from None
    if not shapes:
        raise InputError(weights, key, "adapter weights hold no tensor")
    base = data.get("base_model_name_or_path")
    r, alpha = data.get("r"), data.get("lora_alpha")
    return AdapterInfo(
        directory=directory,
        peft_type=data["peft_type"],
        base_name=base if isinstance(base, str) and base else None,
        r=r if isinstance(r, int) else None,
        alpha=float(alpha) if isinstance(alpha, (int, float)) else None,
        fan_in_fan_out=bool(data.get("fan_in_fan_out", False)),
        shapes=shapes,
    )


def local_base(info: AdapterInfo) -> Path | None:
    """The adapter's base as a local HF directory (absolute, or relative to the adapter
    directory), ``None`` when unset or a hub id the gate cannot fetch."""
    if info.base_name is None:
        return None
    path = Path(info.base_name)
    path = path if path.is_absolute() else info.directory / path
    return path if (path / "config.json").is_file() else None


def base_mismatch(info: AdapterInfo, base_shapes: dict[str, list[int]]) -> str | None:
    """The first adapter tensor that does not fit the base model (another base: other hidden
    sizes or another vocabulary), as a sentence; ``None`` when every tensor fits."""
    for name, shape in sorted(info.shapes.items()):
        inner = name.removeprefix(PEFT_PREFIX)
        part = next((p for p in _LORA_PARTS if p in inner), None)
        target = inner.split(part)[0] + ".weight" if part else inner
        base = base_shapes.get(target)
        if base is None:
            if part is None and target.endswith(".bias"):
                continue  # a trained bias the base lacks is peft's to add
            return f"adapter tensor {name!r} targets {target!r}, which the base model lacks"
        expected = _expected(part, shape, base, info.fan_in_fan_out)
        if expected is not None and list(shape) != expected:
            vocab = " (another vocabulary)" if _is_vocab(target) else ""
            return (f"adapter tensor {name!r} has shape {list(shape)}, the base model's "
                    f"{target!r} {list(base)} needs {expected}{vocab}")
    return None


def _expected(part: str | None, shape: list[int], base: list[int], fan_in_fan_out: bool,
              ) -> list[int] | None:
    """The shape an adapter tensor must have on a base weight of shape ``base``."""
    if part is None:  # modules_to_save: a full copy of the base tensor
        return list(base)
    if len(base) != 2 or len(shape) < 1:
        return None
    out_features, in_features = (base[1], base[0]) if fan_in_fan_out else (base[0], base[1])
    rank = shape[0] if part == ".lora_A." else shape[-1]
    if part == ".lora_A.":
        return [rank, in_features] if len(shape) == 2 else None
    if part == ".lora_B.":
        return [out_features, rank] if len(shape) == 2 else None
    if part == ".lora_embedding_A":  # (r, num_embeddings); the base is (num, dim)
        return [shape[0], base[0]]
    if part == ".lora_embedding_B":  # (dim, r)
        return [base[1], shape[-1]]
    return None


def _is_vocab(target: str) -> bool:
    return any(n in target for n in ("embed", "lm_head", "wte", "word_embeddings"))


def check_fits(info: AdapterInfo, base_dir: Path, key: str) -> None:
    """Before any model loads: ``peft`` is importable and every adapter tensor fits the
    base's stored shapes (read from the safetensors headers); else bad input naming ``key``
    and the first tensor that does not fit."""
    import importlib.util

    if importlib.util.find_spec("peft") is None:
        raise InputError(info.directory, key, "a PEFT adapter needs the peft library: "
                         "pip install 'paritygate[peft]'")
    from safetensors import safe_open

    from paritygate.engines.hf_loading import safetensors_files

    shapes: dict[str, list[int]] = {}
    for path in safetensors_files(base_dir):
        with safe_open(str(path), "pt") as handle:
            names = list(handle.keys())
            shapes.update({k: list(handle.get_slice(k).get_shape()) for k in names})
    stored = {k: v for k, v in info.shapes.items()
              if _target(k) in shapes}  # a tied weight the files omit: judged after loading
    mismatch = base_mismatch(AdapterInfo(**{**info.__dict__, "shapes": stored}), shapes)
    if mismatch is not None:
        raise InputError(info.directory / WEIGHTS_FILE, key,
                         f"the adapter does not fit the base model {base_dir}: {mismatch}")


def _target(name: str) -> str:
    """The base weight key an adapter tensor changes."""
    inner = name.removeprefix(PEFT_PREFIX)
    part = next((p for p in _LORA_PARTS if p in inner), None)
    return inner.split(part)[0] + ".weight" if part else inner


def merge_adapter(base_model: Any, info: AdapterInfo, key: str) -> Any:
    """``base_model`` with the adapter merged into its weights (``PeftModel.from_pretrained``
    then ``merge_and_unload``), in memory, in eval mode. A missing ``peft`` is bad input
    naming the extra; an adapter that does not fit the base names the first tensor."""
    shapes = {k: list(v.shape) for k, v in base_model.state_dict().items()}
    mismatch = base_mismatch(info, shapes)
    if mismatch is not None:
        raise InputError(info.directory / WEIGHTS_FILE, key,
                         f"the adapter does not fit the base model: {mismatch}")
    try:
        from peft import PeftModel
    except ImportError:
        raise InputError(info.directory, key, "a PEFT adapter needs the peft library: "
                         "pip install 'paritygate[peft]'") from None
    try:
        wrapped = PeftModel.from_pretrained(base_model, str(info.directory), is_trainable=False)
        merged = wrapped.merge_and_unload()
    except (ValueError, RuntimeError, KeyError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(info.directory, key, f"peft could not load the adapter: {first}"
                         ) from None
    return merged.eval()
