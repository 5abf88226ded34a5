"""Hugging Face models for the precision measurement: loading, checkpoint coverage, subjects.

:func:`checkpoint_coverage` compares a loaded model with the safetensors it was
loaded from, so a tensor left at random init (a head the checkpoint lacks) or a
checkpoint key the model never used is named before anything is measured:
precision is never measured on random weights. :func:`hf_subject` builds a
subject for any model directory (``AutoModelForCausalLM`` for a ``*ForCausalLM``
architecture, ``AutoModel`` otherwise; safetensors only; never remote code
unless the gate config allows it). The compared output is ``logits`` when the
model has them, else ``last_hidden_state``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paritygate.checkpoints import has_nonfinite
from paritygate.engines.generation import left_pad
from paritygate.errors import InputError, MissingExtra
from paritygate.precision.subject import PrecisionSubject

if TYPE_CHECKING:
    from torch import Tensor


@dataclass
class Coverage:
    """How a loaded model's tensors relate to the checkpoint's.

    ``random_init``: model tensors with no checkpoint tensor (by name, by name
    with or without the base-model prefix, or by equal values under another
    name), tied aliases excluded; ``unused``: checkpoint keys no model tensor
    took; ``differ``: tensors found by name whose loaded values differ from the
    file's; ``tied``: aliases of another model tensor.
    """

    random_init: list[str] = field(default_factory=list)
    unused: list[str] = field(default_factory=list)
    differ: list[str] = field(default_factory=list)
    tied: list[str] = field(default_factory=list)
    nonfinite: list[str] = field(default_factory=list)
    """Checkpoint keys whose stored values hold NaN/Inf."""
    checkpoint_tensors: int = 0

    def finding(
        self, class_key: str = "hf_model.auto_class", heads_key: str | None = None
    ) -> str | None:
        """What the model's tensors and the checkpoint's disagree on, with the likely cause;
        None when every tensor came from the file (``weights_load``'s finding).

        The likely cause follows from which side has tensors the other lacks: both (another
        model class than the checkpoint's), the model only (an incomplete checkpoint), the
        checkpoint only (weights of modules this class does not have). ``class_key`` and
        ``heads_key`` are the config keys the fix names."""
        found = self._disagreement(class_key, heads_key)
        return None if found is None else f"{found[0]} ({found[1]})"

    def refusal(
        self, class_key: str = "hf_model.auto_class", heads_key: str | None = None
    ) -> str | None:
        """The named refusal to measure precision, or None when every tensor came from the
        file: :meth:`finding`, saying that precision is not measured on such a model."""
        found = self._disagreement(class_key, heads_key)
        if found is None:
            return None
        never = (" — precision is never measured on random weights" if self.random_init
                 else " — precision is never measured on part of a checkpoint")  # fmt: skip
        return f"{found[0]}{never} ({found[1]})"

    def _disagreement(self, class_key: str, heads_key: str | None) -> tuple[str, str] | None:
        """``(what differs, why)``, or None when the two sides agree."""
        if not self.random_init and not self.unused:
            return None
        parts = []
        if self.random_init:
            parts.append(
                f"{_count(len(self.random_init), 'model tensor')} with no checkpoint tensor, "
                f"left at random init: {_listing(self.random_init)}"
            )
        if self.unused:
            parts.append(
                f"{_count(len(self.unused), 'checkpoint tensor')} unused by the model: "
                f"{_listing(self.unused)}"
            )
        if self.random_init and self.unused:
            why = ("the model class is not the one the checkpoint was saved from: set "
                   f"{class_key} to it")  # fmt: skip
        elif self.random_init:
            why = ("the checkpoint lacks tensors this model class needs: an incomplete or "
                   "partial save, or a class with a head the checkpoint never had "
                   f"({class_key})")  # fmt: skip
        else:
            instead = (f"declare training-only heads in {heads_key}" if heads_key
                       else "drop those tensors from the file")  # fmt: skip
            why = ("the checkpoint holds weights this model class has no place for, so its "
                   f"output is not the checkpoint's: set {class_key} to the class it was saved "
                   f"from, or {instead}")  # fmt: skip
        return "; ".join(parts), why


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _listing(names: list[str], limit: int = 6) -> str:
    more = len(names) - limit
    return ", ".join(names[:limit]) + (f", +{more} more" if more > 0 else "")


def as_saved(model: object, tensors: dict[str, Tensor], stored: Iterable[str]
             ) -> dict[str, Tensor]:
    """``tensors`` under the names and layout the checkpoint stores them in: transformers >= 5
    fuses per-expert MoE tensors on load (``experts.<i>.gate_proj.weight`` into
    ``experts.gate_up_proj``) and splits them again on save; its own reverse conversion
    (``revert_weight_conversion``) gives the saved layout. Unchanged when the model has no
    conversion, or when the checkpoint already holds the fused names."""
    stored = set(stored)
    if all(name in stored for name in tensors):
        return tensors
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # transformers < 5: no load-time conversion to undo
        return tensors
    try:
        reverted = revert_weight_conversion(model, dict(tensors))  # type: ignore[arg-type]
    except Exception:  # a conversion transformers cannot reverse here: compare as loaded
        return tensors
    if not isinstance(reverted, dict):
        return tensors
    fused_hits = sum(name in stored for name in tensors)
    return reverted if sum(name in stored for name in reverted) > fused_hits else tensors


def checkpoint_coverage(
    model: Any, files: Iterable[Path], loading_info: dict[str, Any] | None = None
) -> Coverage:
    """Compare ``model``'s parameters and buffers with the safetensors ``files``.

    Transformers' own loading info (missing / unexpected / mismatched keys), when
    given, is merged in, so nothing either side noticed is dropped.
    """
    import torch
    from safetensors import safe_open

    handles = [safe_open(str(f), framework="pt") for f in files]
    where = {key: h for h in handles for key in h.keys()}  # noqa: SIM118 (safe_open has no iter)
    prefix = getattr(model, "base_model_prefix", "") or ""
    tensors: dict[str, torch.Tensor] = dict(model.named_parameters(remove_duplicate=False))
    persistent = model.state_dict(keep_vars=True).keys()

    def candidates(name: str) -> list[str]:
        found = [name, f"{prefix}.{name}"] if prefix else [name]
        if prefix and name.startswith(prefix + "."):
            found.append(name[len(prefix) + 1 :])
        return found

    for name, buf in model.named_buffers(remove_duplicate=False):
        if name in persistent or any(c in where for c in candidates(name)):
            tensors[name] = buf
    tensors = as_saved(model, tensors, where)
    coverage = Coverage(checkpoint_tensors=len(where))
    used: set[str] = set()
    owner: dict[tuple[int, int, tuple[int, ...]], str] = {}
    unmatched: list[str] = []
    for name, tensor in tensors.items():
        ident = (tensor.data_ptr(), tensor.numel(), tuple(tensor.shape))
        if tensor.numel() and ident in owner:
            coverage.tied.append(name)
            continue
        owner[ident] = name
        key = next((c for c in candidates(name) if c in where), None)
        if key is None:
            unmatched.append(name)
            continue
        used.add(key)
        stored = where[key].get_tensor(key)
        if has_nonfinite(stored):
            coverage.nonfinite.append(key)
        if stored.shape != tensor.shape or not torch.equal(
            tensor.detach().cpu(), stored.to(tensor.dtype)
        ):
            coverage.differ.append(name)
    spare = [k for k in where if k not in used]
    for name in unmatched:  # renamed on load (old checkpoint names): find it by value
        tensor = tensors[name].detach().cpu()
        match = next(
            (
                k
                for k in spare
                if tuple(where[k].get_slice(k).get_shape()) == tuple(tensor.shape)
                and torch.equal(tensor, where[k].get_tensor(k).to(tensor.dtype))
            ),
            None,
        )
        if match is None:
            coverage.random_init.append(name)
        else:
            spare.remove(match)
    coverage.unused = spare
    info = loading_info or {}
    for key in info.get("missing_keys", []):
        if key not in coverage.random_init and key not in coverage.tied:
            coverage.random_init.append(key)
    for key in info.get("unexpected_keys", []):
        if key not in coverage.unused and key in where and key not in used:
            coverage.unused.append(key)
    for entry in info.get("mismatched_keys", []):
        key = entry[0] if isinstance(entry, (tuple, list)) else str(entry)
        if key not in coverage.random_init:
            coverage.random_init.append(key)
    coverage.random_init.sort()
    coverage.unused.sort()
    return coverage


def select_hf_output(out: Any) -> Any:
    """``logits`` when the model returns them, else ``last_hidden_state``, else the first output."""
    for name in ("logits", "last_hidden_state"):
        value = getattr(out, name, None)
        if value is not None:
            return value
    if isinstance(out, (tuple, list)):
        return out[0]
    return out


def hf_subject(
    model_dir: Path,
    input_ids: list[list[int]],
    *,
    pad_token_id: int = 0,
    batch_size: int = 4,
    trust_remote_code: bool = False,
    name: str = "hf",
) -> PrecisionSubject:
    """Subject of ``model_dir`` on the given token sequences, left-padded into batches.

    The model is loaded here and compared with its checkpoint, so a model with
    tensors left at random init comes back with a ``refusal``.
    """
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise MissingExtra(exc.name or "transformers", "lm") from None
    model_dir = Path(model_dir)
    try:
        config = transformers.AutoConfig.from_pretrained(
            model_dir, trust_remote_code=trust_remote_code
        )
    except Exception as exc:
        raise InputError(
            model_dir / "config.json", None, f"not a readable HF config: {exc}"
        ) from None
    architectures = getattr(config, "architectures", None) or []
    causal = any(a.endswith("ForCausalLM") for a in architectures)
    loader = transformers.AutoModelForCausalLM if causal else transformers.AutoModel
    if not input_ids or not all(input_ids):
        raise InputError(model_dir, "input_ids", "need at least one non-empty token sequence")

    batches = []
    for start in range(0, len(input_ids), batch_size):
        ids, mask = left_pad(input_ids[start : start + batch_size], pad_token_id)  # (B, T)
        batches.append(((), {"input_ids": ids, "attention_mask": mask}))

    try:
        model, info = loader.from_pretrained(  # type: ignore[misc]  # (model, loading info)
            model_dir,
            dtype=torch.float32,
            use_safetensors=True,
            trust_remote_code=trust_remote_code,
            output_loading_info=True,
        )
    except Exception as exc:
        raise InputError(model_dir, None, f"cannot load the model: {exc}") from None
    from paritygate.engines.hf_loading import safetensors_files

    coverage = checkpoint_coverage(model, safetensors_files(model_dir), info)
    return PrecisionSubject(
        name=name,
        build_model=lambda: model.eval(),
        batches=batches,
        select_output=select_hf_output,
        refusal=coverage.refusal(),
    )
