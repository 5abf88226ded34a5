"""The two sides of a causal-LM gate: what the trainer optimised and what is served.

An :class:`LMSide` is one side's whole protocol, validated when the context was built: its
model directory (and the PEFT adapter merged onto it), tokenizer, sampling config and dtype.
Its model and its encoded probes load lazily and are memoised (``cached_property`` writes
past the frozen record's ``__setattr__``: the record never changes from the outside). Code
that treats the sides alike takes an ``LMSide``; what differs between them is a field
(``key``, ``adapter``) or the setup's choice of side, never a test of the side's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paritygate.engines.hf_loading import load_causal_lm
from paritygate.errors import keyed
from paritygate.families.causal_lm.tokenizer import encode_probe

if TYPE_CHECKING:
    from torch import nn

    from paritygate.families.causal_lm.adapter import AdapterInfo
    from paritygate.families.causal_lm.probes import Probe
    from paritygate.families.causal_lm.sampling import SamplingFile
    from paritygate.families.causal_lm.tokenizer import Tokenizer


@dataclass(frozen=True, eq=False)
class LMSide:
    """One side of the gate (``training`` or ``serving``), loaded and validated once."""

    name: str
    """``training`` or ``serving``: the side's word in the config (``causal_lm.tokenizer.<name>``,
    ``causal_lm.sampling.<name>``) and in the report."""
    model_dir: Path
    """The side's model directory (with an adapter: the base it is merged onto)."""
    key: str
    """The config key ``model_dir`` came from (named when it fails to load)."""
    tokenizer: Tokenizer
    sampling: SamplingFile
    dtype: str
    """The dtype the side's model runs in (``training.dtype``, ``engine.dtype``)."""
    probes: tuple[Probe, ...]
    max_prompt_tokens: int
    adapter: AdapterInfo | None = None
    """The PEFT adapter merged onto ``model_dir`` as this side's model, if any."""
    adapter_key: str = ""
    """The config key that named the adapter."""
    trust_remote_code: bool = False
    device_map: str | None = None

    @property
    def pad_id(self) -> int:
        """The tokenizer's pad id (0 when it has none): what a batch is padded with."""
        pad = self.tokenizer.pad_token_id
        return 0 if pad is None else pad

    @cached_property
    def prompts(self) -> list[list[int]]:
        """The probe prompts as token ids, encoded by this side's tokenizer."""
        return [encode_probe(self.tokenizer, p, self.max_prompt_tokens) for p in self.probes]

    def render(self, probe: Probe) -> str:
        """The prompt text of ``probe`` after this side's chat template."""
        from paritygate.families.causal_lm.tokenizer import render_probe

        return render_probe(self.tokenizer, probe, self.max_prompt_tokens)

    @cached_property
    def _loaded(self) -> tuple[nn.Module, dict[str, Any]]:
        with keyed(self.key):
            model, info = load_causal_lm(self.model_dir, self.dtype,
                                         trust_remote_code=self.trust_remote_code,
                                         device_map=self.device_map)
        if self.adapter is not None:
            from paritygate.families.causal_lm.adapter import merge_adapter

            model = merge_adapter(model, self.adapter, self.adapter_key)
        return model, info

    def model(self) -> nn.Module:
        """The side's model (its dtype, eval mode, the adapter merged), loaded once."""
        return self._loaded[0].eval()

    def loading_info(self) -> dict[str, Any]:
        """The model's loading info (missing, unexpected and mismatched keys)."""
        return self._loaded[1]


def serves_training_files(training: LMSide, serving: LMSide) -> bool:
    """The served weights are the training side's own (no served directory configured, or the
    training directory named without an adapter): nothing to compare. A served directory
    naming the adapter's base itself is served as its files, the base alone."""
    if serving.adapter is not None:
        return False
    if serving.key == "causal_lm.model_dir":
        return True
    return training.adapter is None and serving.model_dir.resolve() == training.model_dir.resolve()
