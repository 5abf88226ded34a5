"""The causal-LM context of a run whose checks read only config files (``sampling_config``).

Reads the two sampling configs, the model directories' ``config.json`` and
``generation_config.json``, and from each tokenizer only what a sampling config defaults
from it (EOS token and id, padding and truncation side): the facts HF's tokenizer would give,
read from ``tokenizer_config.json`` and ``tokenizer.json`` with the ``tokenizers`` library.
Nothing here imports torch or transformers; a tokenizer whose facts those files do not state
(no ``tokenizer.json``, a side left to its tokenizer class) is loaded through transformers as
the full context does. Probes, weights, the trainer's log-prob function, the KL reference and
the reward are not read: no config-only check uses them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, cast

from paritygate.errors import InputError, keyed
from paritygate.families.causal_lm.build import (
    SIDES,
    _training_dir,
    make_sides,
    sampling_files,
    setups,
    trained_files,
)
from paritygate.families.causal_lm.context import LMContext
from paritygate.families.causal_lm.inputs import resolve_adapter, sampling_contradictions
from paritygate.families.causal_lm.logprobs import TrainerLogprobs
from paritygate.families.causal_lm.served_files import served_dtype
from paritygate.families.causal_lm.serving import resolve_serving
from paritygate.families.causal_lm.tokenizer import Tokenizer, load_tokenizer
from paritygate.provenance import sha256_files
from paritygate.reading import check_input
from paritygate.reading_text import read_json

if TYPE_CHECKING:
    from tokenizers import Tokenizer as RustTokenizer

    from paritygate.config import GateConfig
    from paritygate.config.causal_lm import CausalLMSpec


def build_config_only_context(config: GateConfig) -> LMContext:
    """The LM context for config-only checks; a server to query (``engines: [endpoint]``)
    needs probes and an engine, so that config gets the full context."""
    from paritygate.families.causal_lm.build import build_lm_context

    spec = config.causal_lm
    if spec is None or "endpoint" in [*spec.engines, spec.serving.engine]:
        return build_lm_context(config)
    spec, adapter, adapter_key = resolve_adapter(config, spec)
    spec, served_from, sources = resolve_serving(config, spec)
    declared = (sources["dtype"], spec.engine.dtype) if "dtype" in sources else None
    training_dir = _training_dir(config, spec)
    engine_dir = spec.engine.model_dir if spec.engine.model_dir else training_dir
    for directory, key in ((training_dir, "causal_lm.model_dir"), (engine_dir, served_from)):
        if directory.is_dir():
            check_input(directory, key, what="model directory", expect="dir")
        if not (directory / "config.json").is_file():
            raise InputError(config.path, key, f"no HF model directory at {directory}")
        with keyed(key):
            _check_config_json(directory / "config.json")
    toks = {side: _declared_tokenizer(config, spec, side, training_dir) for side in SIDES}
    sampling = sampling_files(config, spec, toks, declared)
    from paritygate.engines.hf_loading import safetensors_files

    with keyed("causal_lm.model_dir"):
        trained = trained_files(safetensors_files(training_dir), adapter)
    training, serving = make_sides(config, spec, toks, sampling, (training_dir, engine_dir),
                                   served_from, (), (adapter, adapter_key))
    logprobs = TrainerLogprobs(_not_read("causal_lm.training.logprob_fn"),
                               spec.training.logprob_fn, spec.training.logprobs_mode)
    made = setups(config, spec, training, serving, logprobs, _not_read("causal_lm.engine.dump"))
    return LMContext(
        config=config, spec=spec, training=training, serving=serving, logprobs=logprobs,
        engines=made.engines, generations=made.generations, weights=made.weights,
        behaviour=made.behaviour,
        checkpoint_path=adapter.directory if adapter is not None else training_dir,
        checkpoint_sha256=sha256_files(trained), probes=[], declared_dtype=declared,
        contradictions=sampling_contradictions(sources, engine_dir, sampling["serving"],
                                               toks["serving"]),
        served_config_dtype=served_dtype(engine_dir),
    )


def _check_config_json(path: Path) -> None:
    """``config.json`` read through the bounded reader: a JSON object of finite values."""
    from paritygate.engines.hf_loading import check_config_values

    data = read_json(path, None, what="config.json")
    if not isinstance(data, dict):
        raise InputError(path, None, "config.json is not a JSON object")
    check_config_values(path, data)


def _not_read(key: str) -> Callable[..., NoReturn]:
    def not_read(*args: object, **kwargs: object) -> NoReturn:
        raise RuntimeError(f"{key} is not read for config-only checks")

    return not_read


def _declared_tokenizer(
    config: GateConfig, spec: CausalLMSpec, side: str, model_dir: Path
) -> Tokenizer:
    """The ``side`` tokenizer's facts from its files, else the HF tokenizer itself."""
    directory = getattr(spec.tokenizer, side) or model_dir
    with keyed(f"causal_lm.tokenizer.{side}"):
        found = TokenizerFiles.read(directory)
        if found is not None:
            return cast("Tokenizer", found)  # the facts a sampling config reads
        return load_tokenizer(directory, trust_remote_code=config.trust_remote_code)


class TokenizerFiles:
    """What a sampling config defaults from a tokenizer, read from its saved files; encoding
    is not offered (no config-only check encodes)."""

    SIDES_DEFAULTED = ("padding_side", "truncation_side")

    def __init__(self, settings: dict[str, object], vocab: RustTokenizer,
                 chat_template: str | None) -> None:
        self._vocab = vocab
        self.padding_side = str(settings["padding_side"])
        self.truncation_side = str(settings["truncation_side"])
        self.chat_template = chat_template
        for name in ("pad", "bos", "eos"):
            token = _token_text(settings.get(f"{name}_token"))
            setattr(self, f"{name}_token", token)
            setattr(self, f"{name}_token_id",
                    None if token is None else vocab.token_to_id(token))

    @classmethod
    def read(cls, directory: Path) -> TokenizerFiles | None:
        """The facts of ``directory``'s tokenizer, or ``None`` where its files leave one to
        the tokenizer class (no ``tokenizer.json``, a side or the EOS token not stated)."""
        settings_path = directory / "tokenizer_config.json"
        vocab_path = directory / "tokenizer.json"
        if not (settings_path.is_file() and vocab_path.is_file()):
            return None
        settings = read_json(settings_path, None, what="tokenizer_config.json")
        if (not isinstance(settings, dict) or _token_text(settings.get("eos_token")) is None
                or not all(settings.get(k) in ("left", "right") for k in cls.SIDES_DEFAULTED)):
            return None
        try:
            from tokenizers import Tokenizer as RustTokenizer
        except ImportError:  # pragma: no cover - the lm extra brings tokenizers
            return None
        check_input(vocab_path, None, what="tokenizer.json")
        try:
            vocab = RustTokenizer.from_file(str(vocab_path))
        except Exception as exc:  # the Rust parser's errors have no common type
            raise InputError(vocab_path, None, f"cannot load tokenizer: {exc}") from None
        template = directory / "chat_template.jinja"
        chat_template = settings.get("chat_template")
        if template.is_file():
            from paritygate.reading import read_text

            chat_template = read_text(template, None, what="chat template")
        return cls(settings, vocab, chat_template if isinstance(chat_template, str) else None)

    def get_vocab(self) -> dict[str, int]:
        return dict(self._vocab.get_vocab(with_added_tokens=True))

    def __len__(self) -> int:
        return int(self._vocab.get_vocab_size(with_added_tokens=True))

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [str(self._vocab.id_to_token(i)) for i in ids]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return str(self._vocab.decode(ids, skip_special_tokens=skip_special_tokens))


def _token_text(value: object) -> str | None:
    """A special token as ``tokenizer_config.json`` states it: a string or ``{content: ...}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None
