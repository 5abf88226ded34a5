"""Config section of the hf_model family (``hf_model:`` in a gate YAML).

Paths are relative to the gate config file. Example::

    family: hf_model
    hf_model:
      model_dir: models/all-MiniLM-L6-v2
      auto_class: AutoModel        # default: the architecture named in config.json
      probes: probes/sentences.txt # .txt (one text a line), .jsonl ({"text": ...}) or .npz
      max_tokens: 128
"""

from __future__ import annotations

from pydantic import Field

from paritygate.config_base import ConfigPath, StrictModel


class HFModelSpec(StrictModel):
    """Which model directory, which class loads it, and the inputs it is measured on."""

    model_dir: ConfigPath
    auto_class: str | None = Field(default=None, pattern=r"^[A-Z][A-Za-z0-9]*$")
    """A transformers class (``AutoModel``, ``AutoModelForMaskedLM``, ``BertModel``); default:
    the first of ``architectures`` in the directory's config.json."""
    tokenizer: ConfigPath | None = None
    """Tokenizer directory for text probes (default: ``model_dir``)."""
    probes: ConfigPath
    """``.txt`` (one text a line), ``.jsonl`` (objects with ``text``), or ``.npz`` holding
    ``input_ids`` (integer, (N, T)) and optionally ``attention_mask``."""
    max_tokens: int = Field(default=128, ge=1)
    """Text probes are truncated to this many tokens."""
    batch_size: int = Field(default=8, ge=1)
