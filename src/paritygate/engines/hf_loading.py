"""Small helpers around transformers: quiet loading, dtypes, model loading."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paritygate.errors import InputError, dotted_leaves
from paritygate.reading import check_input
from paritygate.reading_text import check_json_file, json_or_none, read_json

if TYPE_CHECKING:
    import torch


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' load reports and progress bars, restoring the settings after."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def torch_dtype(name: str) -> torch.dtype:
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def load_kwargs(device_map: str | None) -> dict[str, Any]:
    """Extra ``from_pretrained`` keywords for ``device_map`` (``auto`` needs accelerate)."""
    if device_map is None:
        return {}
    import importlib.util

    if importlib.util.find_spec("accelerate") is None:
        raise InputError(
            None, "causal_lm.training.device_map",
            "device_map: auto needs accelerate (pip install 'paritygate[multigpu]')",
        )
    return {"device_map": device_map}


def load_causal_lm(
    directory: Path,
    dtype: str = "float32",
    *,
    trust_remote_code: bool = False,
    device_map: str | None = None,
) -> tuple[Any, dict[str, Any]]:
    """An HF causal LM in eval mode and its loading info (missing/unexpected/mismatched keys).

    Weights are read from safetensors only (``use_safetensors=True``), so loading runs
    no code from the checkpoint unless ``trust_remote_code`` is set by the config.
    ``device_map="auto"`` lets accelerate spread the layers over every visible device
    (and CPU memory), for models larger than one device.
    """
    from transformers import AutoModelForCausalLM

    if not (directory / "config.json").is_file():
        raise InputError(directory, "config.json", "model directory has no config.json")
    extra = load_kwargs(device_map)
    try:
        with quiet_transformers():
            # output_loading_info=True makes it a (model, info) pair
            model, info = AutoModelForCausalLM.from_pretrained(  # type: ignore[misc]
                directory,
                dtype=torch_dtype(dtype),
                trust_remote_code=trust_remote_code,
                use_safetensors=True,
                output_loading_info=True,
                **extra,
            )
    except Exception as exc:
        raise InputError(directory, "model", f"cannot load model: {exc}") from None
    model.eval()  # type: ignore[has-type]
    if device_map is not None:
        keep_io_on_caller(model)  # type: ignore[has-type]
    return model, info  # type: ignore[has-type]


def keep_io_on_caller(model: Any) -> None:
    """Move a dispatched model's inputs to its device and its outputs back to the caller's.

    accelerate hooks a model spread over several devices this way, but places a model that
    fits on one device there with no hook at all: the gate's CPU tensors then meet CUDA
    weights. Hooking the model once here keeps every caller device-agnostic.
    """
    if getattr(model, "_hf_hook", None) is not None:
        return
    from accelerate.hooks import AlignDevicesHook, add_hook_to_module

    device = next(model.parameters()).device
    add_hook_to_module(model, AlignDevicesHook(execution_device=device, io_same_device=True))


PICKLE_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")


def check_model_dir(directory: Path, *, trust_remote_code: bool = False) -> None:
    """Refuse a model directory HF would fail on, or could only load by running its code:
    ``config.json`` unreadable, not a mapping or of an unknown ``model_type`` (custom code
    through ``auto_map`` needs ``trust_remote_code``), safetensors headers unreadable."""

    check_input(directory, None, what="model directory", expect="dir")
    path = directory / "config.json"
    data = read_json(path, None, what="config.json")
    if not isinstance(data, dict):
        raise InputError(path, None, "config.json is not a JSON object")
    model_type = data.get("model_type")
    from transformers import CONFIG_MAPPING

    if not trust_remote_code and model_type not in CONFIG_MAPPING:
        custom = " and names custom code (auto_map)" if "auto_map" in data else ""
        raise InputError(
            path,
            None,
            f"model_type {model_type!r} is not a transformers architecture{custom}; loading it "
            "would run code from the model directory: refused (set trust_remote_code: true to "
            "opt in)" if custom else f"model_type {model_type!r} is not a transformers "
            "architecture (missing, misspelled, or newer than this transformers)",
        )
    check_config_values(path, data)
    rows: dict[str, int] = {}
    for file in safetensors_files(directory):
        check_input(file, None, what="safetensors file")  # no FIFO, device or sparse shard
        try:
            from safetensors import safe_open

            with safe_open(str(file), framework="pt") as fh:
                for name in fh.keys():  # noqa: SIM118 - safe_open has no __iter__
                    if name.endswith(EMBEDDING_NAMES):
                        rows[name] = int(fh.get_slice(name).get_shape()[0])
        except Exception as exc:
            raise InputError(
                file, None, f"unreadable safetensors (truncated or corrupt?): {exc}"
            ) from None
    vocab = _config_int(directory, ("vocab_size",))
    for name, count in rows.items():
        if vocab is not None and count != vocab:
            raise InputError(path, "vocab_size", f"{vocab} but the checkpoint's {name} has "
                             f"{count} rows: the model cannot load these weights")


SIZE_KEYS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "max_position_embeddings", "head_dim", "num_experts",
    "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
)  # fmt: skip
"""config.json sizes that must be positive integers where present (top level or
``text_config``): a model built from anything else fails inside transformers, late."""

EMBEDDING_NAMES = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight",
                   "embed_in.weight")
"""Checkpoint tensors holding the input embedding, one row per token id: their rows must be
``vocab_size`` (transformers refuses the mismatch only after building the model)."""


def check_config_values(path: Path, data: dict[str, Any]) -> None:
    """Refuse a ``config.json`` value no model can be built from, naming its key: NaN or
    Inf anywhere, a size in :data:`SIZE_KEYS` that is not a positive integer."""
    import math

    for key, value in dotted_leaves(data):
        if isinstance(value, float) and not math.isfinite(value):
            raise InputError(path, key, f"{value} is not a finite number")
    for prefix, node in (("", data), ("text_config.", data.get("text_config"))):
        if not isinstance(node, dict):
            continue
        for name in SIZE_KEYS:
            value = node.get(name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise InputError(path, prefix + name,
                                 f"{value!r} is not a positive integer")


def _config_int(directory: Path, names: tuple[str, ...]) -> int | None:
    """The first positive int of ``names`` in a model directory's ``config.json`` (top level
    or ``text_config``), ``None`` when it says none."""

    data = json_or_none(directory / "config.json")
    if not isinstance(data, dict):
        return None
    for node in (data, data.get("text_config")):
        if isinstance(node, dict):
            for name in names:
                size = node.get(name)
                if isinstance(size, int) and not isinstance(size, bool) and size > 0:
                    return size
    return None


def config_vocab_size(directory: Path) -> int | None:
    """``vocab_size`` of a model directory's ``config.json`` (top level or ``text_config``),
    ``None`` when it does not say: the number of token ids the model can embed."""
    return _config_int(directory, ("vocab_size",))


def config_num_experts(directory: Path) -> int | None:
    """The routed experts per MoE layer a model directory's ``config.json`` declares
    (``num_experts``, Mixtral's ``num_local_experts``); ``None`` for a dense model."""
    return _config_int(directory, ("num_experts", "num_local_experts", "n_routed_experts"))


TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "merges.txt",
    "tokenizer.model", "spiece.model", "sentencepiece.bpe.model",
)  # fmt: skip
"""Files a saved tokenizer holds (one at least)."""


def require_tokenizer_files(directory: Path, key: str | None) -> None:
    """Refuse a tokenizer directory that holds no tokenizer: it must exist and hold one of
    :data:`TOKENIZER_FILES`. Without them transformers builds a stand-in from config.json
    alone (a handful of special tokens; every word an unknown token), and probes encoded by
    it would measure nothing of the model's real inputs."""
    if not directory.is_dir():
        raise InputError(directory, key, "tokenizer directory not found")
    check_input(directory, key, what="tokenizer directory", expect="dir")
    if not any((directory / name).is_file() for name in TOKENIZER_FILES):
        raise InputError(
            directory,
            key,
            "no tokenizer files here (tokenizer.json, tokenizer_config.json, vocab.*, *.model); "
            "save the tokenizer with the model (tokenizer.save_pretrained) or name its "
            "directory",
        )
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (directory / name).is_file():  # parsed by transformers: its nesting bounded first
            check_json_file(directory / name, key, what=name)


def safetensors_files(directory: Path) -> list[Path]:
    """The checkpoint's safetensors files (one file or the shards of an index)."""

    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = read_json(index, None, what="index")["weight_map"]
        except (KeyError, TypeError) as exc:
            raise InputError(index, "weight_map", f"unreadable index: {exc}") from None
        if not isinstance(weight_map, dict) or not all(
                isinstance(name, str) and "/" not in name for name in weight_map.values()):
            raise InputError(index, "weight_map", "must map tensor names to shard file names "
                                                  "in this directory")
        return [directory / name for name in sorted(set(weight_map.values()))]
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        pickled = sorted(p for pattern in PICKLE_WEIGHTS for p in directory.glob(pattern))
        if pickled:
            raise InputError(
                pickled[0],
                None,
                "weights only in a pickle format, which can run code from the file; refused "
                "(save the model with safetensors: save_pretrained(..., safe_serialization=True))",
            )
        raise InputError(directory, None, "no .safetensors weights in the model directory")
    return files


def tensor_names(model_dir: Path) -> set[str]:
    """The tensor names a model directory's safetensors files hold (their headers only)."""
    from safetensors import safe_open

    names: set[str] = set()
    for path in safetensors_files(model_dir):
        with safe_open(str(check_input(path, None, what="safetensors file")),
                       framework="pt") as handle:
            names.update(handle.keys())
    return names
