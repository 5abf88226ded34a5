"""The hf_model family context: one model directory, loaded once, its coverage and probes.

Building it validates the config's files (model directory, safetensors,
tokenizer, probes) and raises :class:`~paritygate.errors.InputError` naming
the file and key of the first bad input; the model itself is loaded lazily and
cached, so ``weights_load`` and ``precision_per_layer`` share one copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paritygate.engines.hf_loading import (
    check_model_dir,
    quiet_transformers,
    require_tokenizer_files,
    safetensors_files,
)
from paritygate.errors import InputError, MissingExtra, keyed
from paritygate.families.hf_model.probes import Batch, npz_batches, read_texts, text_batches
from paritygate.provenance import sha256_file, sha256_files
from paritygate.reading import check_input
from paritygate.reading_text import read_json

if TYPE_CHECKING:
    from torch import nn

    from paritygate.config import GateConfig
    from paritygate.config.hf_model import HFModelSpec
    from paritygate.precision.hf import Coverage
    from paritygate.precision.subject import PrecisionSubject
    from paritygate.result import Measurement


@dataclass
class HFModelContext:
    """Loaded inputs of an hf_model gate run (satisfies the family Context protocol)."""

    config: GateConfig
    spec: HFModelSpec
    model_dir: Path
    files: list[Path]
    model_class: Any
    class_reason: str
    """Why this class loads the model (``hf_model.auto_class`` or config.json's architecture)."""
    checkpoint_path: Path
    checkpoint_sha256: str
    batches: list[Batch]
    family: str = "hf_model"

    @property
    def numerics(self) -> dict[str, str]:
        """No setting of an hf_model gate moves its numbers by design."""
        return {}

    def note_probes(self, m: Measurement) -> None:
        """Every probe batch is fed to the model: nothing left out to note."""

    @property
    def probes_sha256(self) -> str:
        """Digest of the probe file."""
        return sha256_file(self.spec.probes)

    @cached_property
    def _loaded(self) -> tuple[nn.Module, dict[str, Any]]:
        import torch

        try:
            with quiet_transformers():  # the load report is kept: coverage() names it
                model, info = self.model_class.from_pretrained(
                    self.model_dir,
                    dtype=torch.float32,
                    use_safetensors=True,
                    trust_remote_code=self.config.trust_remote_code,
                    output_loading_info=True,
                )
        except Exception as exc:
            raise InputError(
                self.model_dir,
                "hf_model.auto_class",
                f"{self.class_reason} cannot load the model: {type(exc).__name__}: {exc}",
            ) from None
        return model.eval(), info

    def _load(self) -> tuple[nn.Module, dict[str, Any]]:
        return self._loaded

    def reference_model(self) -> nn.Module:
        """The model in fp32, eval mode."""
        return self._load()[0]

    def streaming(self) -> tuple[bool, str]:
        """Whether the model's layers are read one at a time (``precision.streaming``), and why."""
        return self._streaming

    @cached_property
    def _streaming(self) -> tuple[bool, str]:
        from paritygate.precision.streaming import stream_decision

        return stream_decision(self.config.precision.streaming, self.files)

    def _streamed(self) -> Any:
        return self._streamed_model

    @cached_property
    def _streamed_model(self) -> Any:
        from paritygate.precision.streaming import build_streamed

        return build_streamed(
            self.model_class, self.model_dir, self.files, self.config.trust_remote_code
        )

    def coverage(self) -> Coverage:
        """Model tensors vs the checkpoint: random-init tensors, unused keys, altered values.

        A streamed model is compared by names and shapes, and its file read one tensor at a
        time for NaN/Inf; its values are the file's by construction."""
        return self._coverage

    @cached_property
    def _coverage(self) -> Coverage:
        if self.streaming()[0]:
            import dataclasses

            streamer = self._streamed()[1]
            return dataclasses.replace(streamer.coverage, nonfinite=streamer.scan_nonfinite())
        from paritygate.precision.hf import checkpoint_coverage

        model, info = self._load()
        return checkpoint_coverage(model, self.files, info)

    def precision_subject(self) -> PrecisionSubject:
        """The loaded model on the probe batches; refuses when tensors are at random init."""
        from paritygate.precision.hf import select_hf_output
        from paritygate.precision.subject import PrecisionSubject

        stream, reason = self.streaming()
        if stream:
            from paritygate.precision.streaming import streaming_note

            model, streamer = self._streamed()
            refusal = streamer.coverage.refusal()
            build, notes = (lambda: model), [streaming_note(streamer, reason)]
        else:
            refusal = self.coverage().refusal()
            build, notes = self.reference_model, []
        return PrecisionSubject(
            name=self.config.name,
            build_model=build,
            batches=self.batches,
            select_output=select_hf_output,
            refusal=None if refusal is None else f"{self.class_reason}: {refusal}",
            streamed=stream,
            extra={"notes": notes},
        )


def _model_class(config: GateConfig, spec: HFModelSpec, model_dir: Path) -> tuple[Any, str]:

    import transformers

    name = spec.auto_class
    if name is not None:
        reason, key = f"hf_model.auto_class {name}", "hf_model.auto_class"
    else:
        try:
            architectures = read_json(model_dir / "config.json", None,
                                      what="config.json").get("architectures") or []
        except AttributeError as exc:
            raise InputError(model_dir / "config.json", None, f"unreadable: {exc}") from None
        if not architectures:
            raise InputError(
                model_dir / "config.json",
                "architectures",
                "names no architecture; set hf_model.auto_class (e.g. AutoModel)",
            )
        name = architectures[0]
        reason, key = f"architecture {name} (config.json)", "architectures"
    cls = getattr(transformers, name, None)
    if (
        cls is None
        or not hasattr(cls, "from_pretrained")
        or name.endswith(("Tokenizer", "TokenizerFast", "Config", "Processor"))
    ):
        where = config.path if spec.auto_class else model_dir / "config.json"
        raise InputError(
            where,
            key,
            f"{name!r} is not a transformers model class (e.g. AutoModel, "
            "AutoModelForSequenceClassification, BertModel)",
        )
    return cls, reason


def build_hf_model_context(config: GateConfig) -> HFModelContext:
    """Validate the inputs of an hf_model gate; raises InputError naming file and key."""
    spec = config.hf_model
    if spec is None:
        raise InputError(config.path, "hf_model", "family hf_model needs an hf_model section")
    try:
        import transformers
    except ImportError as exc:
        raise MissingExtra(exc.name or "transformers", "lm") from None
    model_dir = spec.model_dir
    if not model_dir.is_dir():
        raise InputError(
            config.path, "hf_model.model_dir", f"model directory not found: {model_dir}"
        )
    with keyed("hf_model.model_dir"):
        check_input(model_dir, None, what="model directory", expect="dir")
        if not (model_dir / "config.json").is_file():
            raise InputError(model_dir / "config.json", None, "model directory has no config.json")
        check_model_dir(model_dir, trust_remote_code=config.trust_remote_code)
        files = safetensors_files(model_dir)
        model_class, reason = _model_class(config, spec, model_dir)
    probes = spec.probes
    if not probes.is_file():
        raise InputError(config.path, "hf_model.probes", f"probe file not found: {probes}")
    if probes.suffix == ".npz":
        try:
            hf_config = transformers.AutoConfig.from_pretrained(
                model_dir, trust_remote_code=config.trust_remote_code
            )
        except Exception as exc:
            raise InputError(
                model_dir / "config.json", "hf_model.model_dir", f"not a readable HF config: {exc}"
            ) from None
        with keyed("hf_model.probes"):
            batches = npz_batches(probes, getattr(hf_config, "vocab_size", None), spec.batch_size)
    else:
        tok_dir = spec.tokenizer if spec.tokenizer else model_dir
        require_tokenizer_files(tok_dir, "hf_model.tokenizer")
        try:
            with quiet_transformers():
                tokenizer = transformers.AutoTokenizer.from_pretrained(
                    tok_dir, trust_remote_code=config.trust_remote_code
                )
        except Exception as exc:
            raise InputError(
                tok_dir, "hf_model.tokenizer", f"cannot load the tokenizer for text probes: {exc}"
            ) from None
        with keyed("hf_model.probes"):
            batches = text_batches(
                tokenizer, read_texts(probes), spec.max_tokens, spec.batch_size, probes
            )
    return HFModelContext(
        config=config,
        spec=spec,
        model_dir=model_dir,
        files=files,
        model_class=model_class,
        class_reason=reason,
        checkpoint_path=files[0] if len(files) == 1 else model_dir,
        checkpoint_sha256=sha256_files(files),
        batches=batches,
    )
