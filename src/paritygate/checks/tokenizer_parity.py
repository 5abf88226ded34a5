"""tokenizer_parity: the serving tokenizer turns every probe into the trainer's token ids.

Compares, for the training and the serving tokenizer (each with its chat template):
token ids of every probe (plain text and chats), BOS/EOS/PAD ids, whether BOS is
added, padding and truncation side (generation needs left padding), and the
rendered chat template. Differences listed in ``causal_lm.tokenizer.allow`` (each
with a reason) are reported but do not fail.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from paritygate.causes import Explanation
from paritygate.check import CheckSpec
from paritygate.checks.sampling_config import ALLOW_FIELD, KIND, record_contradictions
from paritygate.records import Record
from paritygate.result import Measurement

if TYPE_CHECKING:
    from paritygate.families.causal_lm.context import LMContext

ALLOWABLE = (
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "add_bos",
    "padding_side",
    "truncation_side",
    "chat_template",
    "token_ids",
)

# Token ids are discrete: one differing id changes what the policy conditions on.
DEFAULTS: dict[str, float] = {"probes_mismatched": 0.0, "special_ids_mismatched": 0.0}


@dataclass(frozen=True)
class TokenizerFacts(Record):
    """One side's special ids, sides and vocabulary size."""

    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None
    padding_side: str
    truncation_side: str
    vocab_size: int


@dataclass(frozen=True)
class TokenizerRecord(Record):
    """A row per probe (both sides' ids), and each side's tokenizer facts."""

    probes: list[dict[str, object]]
    tokenizers: dict[str, TokenizerFacts]


def _first_divergence(reference: list[int], candidate: list[int]) -> int:
    for i, (r, c) in enumerate(zip(reference, candidate, strict=False)):
        if r != c:
            return i
    return min(len(reference), len(candidate))


def measure(ctx: LMContext, thresholds: Mapping[str, float]) -> Measurement:
    m = Measurement("tokenizer_parity")
    train, serve = ctx.training.tokenizer, ctx.serving.tokenizer
    allow = {e.field: e.reason for e in ctx.spec.tokenizer.allow}
    for name in allow:
        if name not in ALLOWABLE and name != ALLOW_FIELD:
            m.fail(
                "unknown_allow_field",
                f"allow-list names unknown tokenizer field {name!r}; known: {', '.join(ALLOWABLE)}"
            )

    def differs(field: str, cause: str) -> None:
        _differs(m, allow, field, cause)

    special_mismatch = 0
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        t, s = getattr(train, name, None), getattr(serve, name, None)
        if t != s:
            special_mismatch += name not in allow
            differs(name, f"{name} differs: training {t} vs serving {s}")

    probe_text = "The cat"
    t_ids = train(probe_text)["input_ids"]
    s_ids = serve(probe_text)["input_ids"]
    t_bos = bool(t_ids) and train.bos_token_id is not None and t_ids[0] == train.bos_token_id
    s_bos = bool(s_ids) and serve.bos_token_id is not None and s_ids[0] == serve.bos_token_id
    if t_bos != s_bos:
        special_mismatch += "add_bos" not in allow
        who, other = ("serving", "training") if t_bos else ("training", "serving")
        differs(
            "add_bos",
            f"{who} tokenizer does not add BOS ({train.bos_token!r}, id {train.bos_token_id}); "
            f"{other} does",
        )

    if serve.padding_side != "left":
        m.fail(
            "padding_side",
            f"serving tokenizer pads on the {serve.padding_side}: batched generation needs "
            "left padding (the first new token would follow pad tokens)"
        )
    for name in ("padding_side", "truncation_side"):
        t, s = getattr(train, name), getattr(serve, name)
        if t != s:
            differs(name, f"{name} differs: training {t!r} vs serving {s!r}")

    t_template = getattr(train, "chat_template", None) or ""
    s_template = getattr(serve, "chat_template", None) or ""
    rows, mismatched = _compare_probes(m, ctx, allow)
    if (
        t_template != s_template
        and "chat_template" not in allow
        and not any(p.is_chat for p in ctx.probes)
    ):
        m.fail(
            "chat_template_differs",
            "chat template differs between the training and the serving tokenizer")

    for part in ("tokenizer", "chat template"):
        record_contradictions(m, ctx, part, allow)
    m.metric("probes_mismatched", mismatched, threshold=thresholds["probes_mismatched"], key=True)
    m.metric(
        "special_ids_mismatched", special_mismatch, threshold=thresholds["special_ids_mismatched"]
    )
    m.metric("probes_compared", len(rows), bad="none", ratchet=False)
    m.record(TokenizerRecord(rows, {
        side: TokenizerFacts(tok.bos_token_id, tok.eos_token_id, tok.pad_token_id,
                             tok.padding_side, tok.truncation_side, len(tok))
        for side, tok in (("training", train), ("serving", serve))
    }))
    return m


def _differs(m: Measurement, allow: Mapping[str, str], field: str, cause: str) -> None:
    """A difference in ``field``: a note when the allow-list names it, else a failure."""
    if field in allow:
        m.note(f"{cause} (allowed: {allow[field]})")
    else:
        m.fail(f"{field}_differs", cause)


def _compare_probes(
    m: Measurement, ctx: LMContext, allow: Mapping[str, str]
) -> tuple[list[dict[str, Any]], int]:
    """Each probe's token ids (and rendered chat) on both sides: the report's rows and the
    count of probes that tokenize differently (not allowed)."""
    def differs(field: str, cause: str) -> None:
        _differs(m, allow, field, cause)

    rows: list[dict[str, Any]] = []
    mismatched = 0
    encoded = zip(ctx.probes, ctx.training.prompts, ctx.serving.prompts, strict=True)
    for probe, t_seq, s_seq in encoded:
        same = t_seq == s_seq
        row: dict[str, Any] = {
            "probe": probe.id,
            "training_len": len(t_seq),
            "serving_len": len(s_seq),
            "equal": same,
        }
        if probe.is_chat:
            t_text, s_text = ctx.training.render(probe), ctx.serving.render(probe)
            if t_text != s_text:
                at = _first_divergence(list(map(ord, t_text)), list(map(ord, s_text)))
                differs(
                    "chat_template",
                    f"chat template differs: probe {probe.id!r} renders differently from char "
                    f"{at}: training {t_text[at : at + 24]!r} vs serving {s_text[at : at + 24]!r}",
                )
        if not same:
            at = _first_divergence(t_seq, s_seq)
            row["first_divergence"] = at
            row["training_tokens"] = t_seq[at : at + 5]
            row["serving_tokens"] = s_seq[at : at + 5]
            if "token_ids" not in allow:
                mismatched += 1
                m.fail(
                    "tokenization_differs",
                    f"probe {probe.id!r} tokenizes differently at token {at}: training "
                    f"{t_seq[at : at + 3]} vs serving {s_seq[at : at + 3]}"
                )
        rows.append(row)
    return rows, mismatched


CHECK = CheckSpec(
    id="tokenizer_parity",
    summary="training and serving tokenizers give the same token ids and special tokens",
    measures={"causal_lm": measure},
    defaults=DEFAULTS,
    marks=("fast",),
    kinds=(*(f"{name}_differs" for name in ALLOWABLE), "unknown_allow_field",
           "padding_side", "tokenization_differs", KIND),
    feeds_probes=True,  # names the probes cut before tokenizing
)

CAUSES: tuple[Explanation, ...] = (
    Explanation("tokenizer_parity", "serving_file_contradicts_served_dir",
                ("serving_file_contradicts_served_dir",),
                ("sampling_config", "logprob_delta", "vllm_delta", "generation_parity"),
                "a serving file the config declares is not the one the served directory "
                "ships, so the gate judged a serving setup that does not ship",
                fix="remove the declared serving path (the served directory's own file is "
                    "the default), or ship the declared file",
                rank=290),
    Explanation("tokenizer_parity", "tokenizer", None,
                ("sampling_config", "logprob_delta", "vllm_delta", "generation_parity",
                 "batch_invariance"),
                "the serving tokenizer encodes prompts differently from training",
                fix="ship the training tokenizer's files with the served copy (left padding for "
                    "generation, the same special tokens and chat template), or accept a "
                    "difference with a reason: causal_lm.tokenizer.allow: [{field, reason}]",
                rank=310),
)

POSITION = 60
"""The check's place in the checklist (and in every report): the registry sorts by it."""
