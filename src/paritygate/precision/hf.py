"""A precision subject for any Hugging Face model directory (causal LM or encoder).

``AutoModelForCausalLM`` when the config names a ``*ForCausalLM`` architecture,
``AutoModel`` otherwise; weights from safetensors; never remote code unless
the gate config allows it. The compared output is ``logits`` when the model
has them, else ``last_hidden_state``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from paritygate.errors import InputError, MissingExtra
from paritygate.precision.subject import PrecisionSubject


def _select(out: Any) -> Any:
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
    """Subject of ``model_dir`` on the given token sequences, left-padded into batches."""
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
        chunk = input_ids[start : start + batch_size]
        width = max(len(ids) for ids in chunk)
        ids = torch.full((len(chunk), width), pad_token_id, dtype=torch.long)  # (B, T)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)  # (B, T)
        for row, seq in enumerate(chunk):
            ids[row, width - len(seq) :] = torch.tensor(seq)
            mask[row, width - len(seq) :] = 1
        batches.append(((), {"input_ids": ids, "attention_mask": mask}))

    def build() -> Any:
        try:
            model = loader.from_pretrained(
                model_dir,
                dtype=torch.float32,
                use_safetensors=True,
                trust_remote_code=trust_remote_code,
            )
        except Exception as exc:
            raise InputError(model_dir, None, f"cannot load the model: {exc}") from None
        return model.eval()

    return PrecisionSubject(name=name, build_model=build, batches=batches, select_output=_select)
