"""The reward of the RL loop (``causal_lm.reward``): its inputs, validated once, and scoring.

A reward model is an HF ``AutoModelForSequenceClassification`` with one label, as TRL's
``RewardTrainer`` writes it; its score for a sequence is its head's output at one position,
which transformers picks as the rightmost token that is not ``config.pad_token_id`` (batches
need a pad id). This module validates the block before any check runs (a sequence
classifier, one label, a tokenizer, a reward function that takes ``(prompts, completions)``)
and encodes (prompt, completion) samples the way one side scores them;
:mod:`.reward_scoring` scores them, recording where each score was read.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paritygate.errors import InputError, keyed
from paritygate.families.causal_lm.reward_scoring import RewardModel, Scores, score
from paritygate.reading_text import iter_json_lines, read_json_object

if TYPE_CHECKING:

    from paritygate.config import GateConfig
    from paritygate.config.causal_lm import CausalLMSpec
    from paritygate.engines.generation import Generation
    from paritygate.families.causal_lm.probes import Probe
    from paritygate.families.causal_lm.tokenizer import Tokenizer
    from paritygate.sections.reward_parity import RewardScoring

KEY = "causal_lm.reward"
GENERATED = "generated"
"""``completions: generated``: score the HF engine's greedy continuations of the probes."""


@dataclass(frozen=True)
class Sample:
    """One scored (prompt, completion) pair."""

    id: str
    prompt: str
    completion: str


@dataclass(frozen=True)
class Layout:
    """One side's scoring settings, defaults resolved from the reward tokenizer."""

    padding_side: str
    max_length: int | None
    truncation_side: str
    scored_span: str
    chat_template: bool
    append_eos: bool
    batch_size: int

    def differences(self, other: Layout) -> list[str]:
        """The fields (other than ``batch_size``) where ``other`` differs from this one."""
        names = ("padding_side", "max_length", "truncation_side", "scored_span",
                 "chat_template", "append_eos")
        return [n for n in names if getattr(self, n) != getattr(other, n)]


@dataclass
class Encoded:
    """Token ids of every sample under one layout, and how many were cut to ``max_length``."""

    seqs: list[list[int]]
    cut: list[bool]
    full_lengths: list[int]


@dataclass
class RewardSetup:
    """The validated ``causal_lm.reward`` block."""

    model_dir: Path | None
    trained_dir: Path | None
    tokenizer: Tokenizer | None
    dtype: str | None
    training: Layout | None
    serving: Layout | None
    function: Callable[..., Any] | None
    function_name: str | None
    samples: list[Sample]
    function_matches_model: bool = True
    """``function`` serves the reward model's scores (compared with them when both are set)."""
    generated: bool = False
    """``completions: generated``: the samples are the HF engine's greedy continuations of the
    probes, set by :meth:`with_generated` when the check runs."""
    config_pad_token_id: int | None = None
    scoring: RewardModel | None = None
    """The scoring copy (``model_dir``, in its declared dtype), as the RL loop scores with it."""
    trained: RewardModel | None = None
    """The trained model (``trained_dir``, float32): the scoring copy itself where that is the
    trained directory run in float32."""

    def with_generated(self, generation: Generation, probe_ids: list[str], policy_tok: Tokenizer
                       ) -> RewardSetup:
        """This setup scoring the probes' generated continuations (a
        :class:`~paritygate.engines.generation.Generation`), decoded by the policy's tokenizer;
        empty continuations are left out."""
        from dataclasses import replace

        samples = [
            Sample(pid, policy_tok.decode(p, skip_special_tokens=True),
                   policy_tok.decode(o, skip_special_tokens=True))
            for pid, p, o in zip(probe_ids, generation.prompt_ids, generation.output_ids,
                                 strict=True)
            if policy_tok.decode(o, skip_special_tokens=True).strip()
        ]
        return replace(self, samples=samples, generated=False)

    def compare_with_trained(self) -> Any:
        """The scoring copy's tensors against the trained model's
        (:class:`~paritygate.families.causal_lm.weights.WeightsDiff`)."""
        from paritygate.families.causal_lm.weights import compare_states, read_state

        assert self.trained_dir is not None and self.model_dir is not None
        return compare_states(read_state(self.trained_dir), read_state(self.model_dir), [])

    def score(self, model: RewardModel | None, seqs: list[list[int]], side: str,
              batch_size: int, extra: int = 0) -> Scores:
        """:func:`score` with ``model`` (:attr:`scoring` or :attr:`trained`), padded on
        ``side`` with the tokenizer's pad (its EOS when it has none, as TRL does)."""
        assert model is not None, "scoring needs causal_lm.reward.model_dir"
        return score(model.model(), seqs, self.pad_id, side, batch_size, extra)

    @property
    def pad_id(self) -> int:
        """The id the scorer pads with: the tokenizer's pad, else its EOS, else 0."""
        tok = self.tokenizer
        if tok is None:
            return 0
        return int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id or 0)

    def length_variants(self, repeats: tuple[int, ...]) -> list[Sample]:
        """Each sample with its completion repeated ``repeats`` times (same content, longer)."""
        return [Sample(f"{s.id}x{k}", s.prompt, "".join([s.completion] * k))
                for s in self.samples for k in repeats]

    def encode(self, layout: Layout, samples: list[Sample] | None = None) -> Encoded:
        """Token ids of ``samples`` (default: all) as ``layout`` feeds the reward model."""
        tok = self.tokenizer
        assert tok is not None, "encode needs the reward model's tokenizer"
        seqs, cut, full = [], [], []
        for s in self.samples if samples is None else samples:
            ids = _encode_text(tok, s, layout)
            full.append(len(ids))
            if layout.max_length is not None and len(ids) > layout.max_length:
                n = layout.max_length
                ids = ids[len(ids) - n:] if layout.truncation_side == "left" else ids[:n]
                cut.append(True)
            else:
                cut.append(False)
            seqs.append(ids)
        return Encoded(seqs, cut, full)


def _encode_text(tok: Tokenizer, s: Sample, layout: Layout) -> list[int]:
    eos = tok.eos_token or ""
    # as TRL's RewardTrainer: EOS appended unless the text already ends with it
    completion = s.completion + (eos if layout.append_eos and not s.completion.endswith(eos)
                                 else "")
    if layout.chat_template:
        messages = [{"role": "assistant", "content": completion}]
        if layout.scored_span == "prompt_completion":
            messages.insert(0, {"role": "user", "content": s.prompt})
        text = tok.apply_chat_template(messages, tokenize=False)
        return list(tok(text, add_special_tokens=False)["input_ids"])
    text = completion if layout.scored_span == "completion" else s.prompt + completion
    return list(tok(text)["input_ids"])


def _config_json(directory: Path, key: str) -> dict[str, Any]:
    path = directory / "config.json"
    if not path.is_file():
        raise InputError(path, key, "not an HF model directory (no config.json)")
    return read_json_object(path, key, what="config.json")


def _check_classifier(config: GateConfig, directory: Path, key: str) -> dict[str, Any]:
    """A sequence classifier with exactly one label (a scalar reward)."""
    from paritygate.engines.hf_loading import check_model_dir

    data = _config_json(directory, key)
    archs = data.get("architectures") or []
    if not any(str(a).endswith("ForSequenceClassification") for a in archs):
        raise InputError(directory / "config.json", key,
                         f"architectures {archs} is not a sequence-classification model "
                         "(AutoModelForSequenceClassification, as TRL's RewardTrainer saves it)")
    labels = data.get("id2label")
    n = len(labels) if isinstance(labels, dict) else data.get("num_labels", 2)
    if n != 1:
        raise InputError(directory / "config.json", key,
                         f"num_labels is {n}: a reward model has one label (a scalar score)")
    with keyed(key):
        check_model_dir(directory, trust_remote_code=config.trust_remote_code)
    return data


def _layout(scoring: RewardScoring, tok: Tokenizer) -> Layout:
    return Layout(
        padding_side=scoring.padding_side or tok.padding_side,
        max_length=scoring.max_length,
        truncation_side=scoring.truncation_side or tok.truncation_side,
        scored_span=scoring.scored_span,
        chat_template=scoring.chat_template,
        append_eos=scoring.append_eos,
        batch_size=scoring.batch_size,
    )


def _function(config: GateConfig, name: str) -> Callable[..., Any]:
    from paritygate.imports import guard_user_code, import_callable

    key = f"{KEY}.function"
    fn = import_callable(name, config.path, key)
    try:
        inspect.signature(fn).bind(prompts=[], completions=[])
    except TypeError:
        raise InputError(config.path, key,
                         f"{name} takes {inspect.signature(fn)}; expected (prompts, "
                         "completions, **kwargs) returning one float per completion") from None
    except ValueError:
        pass
    guarded: Callable[..., Any] = guard_user_code(fn, config.path, key)
    return guarded


def split_probe(probe: Probe) -> Sample | None:
    """A text probe split in two at the word boundary nearest its middle (``None`` for a chat
    or a text of fewer than two words)."""
    text = probe.text
    if not text or probe.is_chat:
        return None
    words = text.split(" ")
    if len(words) < 2:
        return None
    half = len(words) // 2
    return Sample(probe.id, " ".join(words[:half]), " " + " ".join(words[half:]))


def _from_dump(path: Path, policy_tok: Tokenizer) -> list[Sample]:
    """A rollout dump's records (``paritygate dump``, or any engine's) decoded by the policy's
    tokenizer: prompt and completion text as the reward saw them in training."""
    from paritygate.engines.rollout_dump import read_dump

    with keyed(f"{KEY}.completions"):
        records = read_dump(path, vocab_size=len(policy_tok))
    if len(records) > MAX_COMPLETIONS:
        raise InputError(path, f"{KEY}.completions", f"more than {MAX_COMPLETIONS} records to "
                         "score (MAX_COMPLETIONS)")
    return [Sample(str(i), policy_tok.decode(r["prompt_ids"], skip_special_tokens=True),
                   policy_tok.decode(r["completion_ids"], skip_special_tokens=True))
            for i, r in enumerate(records)]


MAX_COMPLETIONS = 4096
"""``causal_lm.reward.completions`` holds at most this many (prompt, completion) pairs: each
is scored under every layout variant, and at 4,096 the mean score's standard error is 1.6% of
the scores' spread, finer than any difference reward_parity judges; more only costs time."""


def _read_completions(config: GateConfig, value: str, policy_tok: Tokenizer) -> list[Sample]:
    path = config.resolve(value)
    key = f"{KEY}.completions"
    if path.suffix == ".parquet":
        return _from_dump(path, policy_tok)
    out: list[Sample] = []
    for n, row in iter_json_lines(path, key, what="completions file",
                                  max_records=MAX_COMPLETIONS, records_bound="MAX_COMPLETIONS"):
        if not out and isinstance(row, dict) and "prompt_ids" in row:
            return _from_dump(path, policy_tok)
        if not (isinstance(row, dict) and isinstance(row.get("prompt"), str)
                and isinstance(row.get("completion"), str)):
            raise InputError(path, f"{key}: line {n}",
                             'expected {"prompt": str, "completion": str}')
        out.append(Sample(str(row.get("id", n)), row["prompt"], row["completion"]))
    if not out:
        raise InputError(path, key, "no completions")
    return out


def load_reward(
    config: GateConfig, spec: CausalLMSpec, probes: list[Probe], policy_tok: Tokenizer
) -> RewardSetup | None:
    """Validate ``causal_lm.reward`` (``None`` when absent); raises :class:`InputError` naming
    the key of the first bad input."""
    from paritygate.families.causal_lm.tokenizer import load_tokenizer
    from paritygate.sections.reward_parity import RewardSpec

    block = RewardSpec.of(spec)
    if block is None:
        return None
    model_dir = trained_dir = None
    tok = None
    pad_id: int | None = None
    if block.model_dir is not None:
        model_dir = block.model_dir
        data = _check_classifier(config, model_dir, f"{KEY}.model_dir")
        pad_id = data.get("pad_token_id")
        trained_dir = model_dir
        if block.trained_dir is not None:
            trained_dir = block.trained_dir
            trained = _check_classifier(config, trained_dir, f"{KEY}.trained_dir")
            for name in ("model_type", "architectures", "hidden_size", "num_hidden_layers"):
                if trained.get(name) != data.get(name):
                    raise InputError(config.path, f"{KEY}.trained_dir",
                                     f"{name} {trained.get(name)!r} differs from the scoring "
                                     f"copy's {data.get(name)!r}")
        tok_dir = block.tokenizer if block.tokenizer else model_dir
        with keyed(f"{KEY}.tokenizer" if block.tokenizer else f"{KEY}.model_dir"):
            tok = load_tokenizer(tok_dir, trust_remote_code=config.trust_remote_code)
        for side in ("training", "serving"):
            scoring = getattr(block, side) or block.training
            if scoring.chat_template and not getattr(tok, "chat_template", None):
                raise InputError(config.path, f"{KEY}.{side}.chat_template",
                                 "the reward tokenizer has no chat template")
    generated = block.completions == GENERATED
    if generated:
        samples: list[Sample] = []
    elif block.completions:
        samples = _read_completions(config, block.completions, policy_tok)
    else:
        samples = [s for p in probes if (s := split_probe(p)) is not None]
    if not samples and not generated:
        raise InputError(config.path, KEY,
                         "no (prompt, completion) to score: no text probe has two words; "
                         "give causal_lm.reward.completions")
    scoring_model = trained_model = None
    if model_dir is not None and trained_dir is not None:
        trust = config.trust_remote_code
        scoring_model = RewardModel(model_dir, block.dtype or "float32", f"{KEY}.model_dir",
                                    trust)
        trained_model = (scoring_model if trained_dir == model_dir and block.dtype is None
                         else RewardModel(trained_dir, "float32", f"{KEY}.trained_dir", trust))
    return RewardSetup(
        model_dir=model_dir,
        trained_dir=trained_dir,
        tokenizer=tok,
        dtype=block.dtype,
        training=_layout(block.training, tok) if tok is not None else None,
        serving=_layout(block.serving or block.training, tok) if tok is not None else None,
        function=_function(config, block.function) if block.function else None,
        function_name=block.function,
        function_matches_model=block.function_matches_model,
        samples=samples,
        generated=generated,
        config_pad_token_id=pad_id,
        scoring=scoring_model,
        trained=trained_model,
    )
