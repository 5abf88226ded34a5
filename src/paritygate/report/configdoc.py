"""The config reference, generated from the pydantic config models.

Each key's type, default and description come from the model that validates it (the
description is the attribute docstring written under the field), so the reference cannot
drift from what ``paritygate run`` accepts. Threshold defaults come from each check's
declared ``defaults``.
"""

from __future__ import annotations

import ast
import enum
import inspect
import json
import re
import textwrap
import types
import typing
from dataclasses import dataclass
from functools import cache
from pathlib import PurePath

from pydantic import BaseModel

from paritygate.checks import checks_for
from paritygate.config import GateConfig

FAMILIES: dict[str, str] = {"policy": "Torch / ONNX policy", "causal_lm": "Causal-LM policy",
                            "hf_model": "Hugging Face model (precision only)"}
"""Each family and its page title."""
COMMON_SECTIONS = ("golden", "precision")
"""Top-level sections every family shares; the family's own section is documented per family."""


NOTES: dict[str, str] = {
    "name": "The gate's name: the report's title and the golden folder (unless `golden.baseline`).",
    "family": "Which section describes the model: `policy`, `causal_lm` or `hf_model`.",
    "checks": "The check ids to run; default: every check of the family. An id the family does "
              "not run is bad input (exit 2).",
    "skip_checks": "Check ids left out of the family's checks.",
    "report_dir": "Where the reports go, relative to the config; default `reports/<name>`; "
                  "`--report-dir` overrides it.",
    "seed": "Seeds the probes, sampling and rollouts the gate draws.",
    "trust_remote_code": "Let transformers run a model directory's own code (off: never).",
    "policy.factory_kwargs": "Keyword arguments both factories are called with.",
    "policy.checkpoint": "The training model's state dict: `.safetensors`, `.pt`/`.pth` "
                         "(`weights_only`), or an SB3 `.zip`.",
    "policy.inputs[].name": "The input's name (a Dict observation's key, the artifact's input).",
    "policy.inputs[].preprocessing.kwargs": "Extra keyword arguments for both preprocessing "
                                            "functions.",
    "policy.preprocessing.kwargs": "Extra keyword arguments for both preprocessing functions.",
    "policy.recurrent.states[].input": "The state input's name (fed back each step).",
    "policy.recurrent.states[].output": "The output that carries the state to the next step.",
    "policy.action_space": "`discrete` (KL/TV/argmax metrics) or `continuous` (diffs, and with "
                           "`distribution` the Gaussian's metrics).",
    "policy.probes.file": "A `.npy`/`.npz` of raw observations (instead of `generator`).",
    "policy.probes.count": "How many observations the generator draws (generator only).",
    "policy.probes.seed": "The generator's seed (generator only).",
    "policy.opset": "The ONNX opset of an on-the-fly export (at least 13).",
    "policy.batch_sizes": "Batch sizes the batch-independence probes use.",
    "policy.dropout_repeats": "K: repeated runs that must be bitwise identical (`dropout_off`).",
    "policy.rollout.env_kwargs": "Passed to `gymnasium.make(env, ...)` or to the factory.",
    "policy.rollout.episodes": "Episodes per side; reset seeds `seed`, `seed+1`, ... "
                               "(or `seeds`).",
    "policy.rollout.seed": "The first episode's reset seed.",
    "causal_lm.tokenizer.serving_chat_template": "A chat template file for serving; default: the "
                                                 "serving tokenizer's own.",
    "causal_lm.tokenizer.allow[].field": "The tokenizer field whose difference is accepted.",
    "causal_lm.tokenizer.allow[].reason": "Why (mandatory; shown in the report).",
    "causal_lm.sampling.serving_format": "The serving sampling file's format; `auto`: detected "
                                         "from the file.",
    "causal_lm.sampling.allow[].field": "The sampling field whose difference is accepted.",
    "causal_lm.sampling.allow[].reason": "Why (mandatory; shown in the report).",
    "causal_lm.max_prompt_tokens": "Probe prompts are truncated to this many tokens.",
    "causal_lm.training.dtype": "The trainer's dtype for the recompute.",
    "causal_lm.engine.dtype": "The engine's dtype; default: the served `config.json`'s (same "
                              "key as `serving.dtype`).",
    "causal_lm.engine.logprobs_mode": "`processed`: temperature/top-k/top-p applied; `raw`: "
                                      "plain softmax.",
    "causal_lm.engine.top_logprobs": "How many top log-probs the engine returns per token.",
    "causal_lm.engine.batch_size": "Prompts per engine batch.",
    "causal_lm.reference.logprob_convention": "`model`, `logits` or `auto`, as "
                                              "`training.logprob_convention`.",
    "causal_lm.reward.training.batch_size": "Texts per scoring batch (training side).",
    "causal_lm.reward.serving.batch_size": "Texts per scoring batch (serving side).",
    "hf_model.model_dir": "The model directory (`config.json` and weights).",
    "hf_model.batch_size": "Probes per forward batch.",
    "precision.dtypes": "The low precisions measured per layer.",
}
"""Meanings of the keys whose model field carries no docstring (the rest come from the code)."""


@dataclass(frozen=True)
class KeyDoc:
    """One config key as the reference lists it."""

    path: str
    type: str
    default: str
    source: str
    description: str


def _plain(docstring: str) -> str:
    """A docstring as one Markdown line: reST literals and roles become code spans."""
    text = " ".join(inspect.cleandoc(docstring).split()).replace("``", "`")
    return re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text)


@cache
def _attribute_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings of ``cls`` (the string literal written under a field)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for node, following in zip(body, [*body[1:], None], strict=True):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)):
            docs[node.target.id] = _plain(following.value.value)
    return docs


def _field_doc(model: type[BaseModel], name: str) -> tuple[str, str]:
    """The field's description and the class that declares it (walking the bases)."""
    for cls in model.__mro__:
        if isinstance(cls, type) and issubclass(cls, BaseModel) and name in cls.__annotations__:
            return _attribute_docs(cls).get(name, ""), cls.__name__
    return "", model.__name__


def _type_name(annotation: object) -> str:
    """A short, readable type: ``int``, ``str | None``, ``list[InputSpec]``, ``'a' | 'b'``."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(_type_name(a) for a in args)}]"
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", str(annotation).replace("typing.", ""))


def _nested_model(annotation: object) -> tuple[type[BaseModel], str] | None:
    """The config model a field holds and how its keys are addressed below it."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, "."
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            found = _nested_model(arg)
            if found:
                return found
    if origin is list and args:
        found = _nested_model(args[0])
        return (found[0], "[]." ) if found else None
    if origin is dict and len(args) == 2:
        found = _nested_model(args[1])
        return (found[0], ".<name>.") if found else None
    return None


def _default(model: type[BaseModel], name: str) -> str:
    field = model.model_fields[name]
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "(section)"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, PurePath):  # a path key's default, as the config writes it
        value = str(value)
    return f"`{json.dumps(value)}`"


def model_keys(model: type[BaseModel], prefix: str = "") -> list[KeyDoc]:
    """Every key of ``model`` and of the sections nested in it, depth first, in field order."""
    keys: list[KeyDoc] = []
    for name, field in model.model_fields.items():
        description, owner = _field_doc(model, name)
        module = inspect.getmodule(model)
        where = f"{module.__name__ if module else '?'}.{owner}"
        path = f"{prefix}{name}"
        description = (description or NOTES.get(path, "") or _key_doc(field.annotation)
                       or _section_doc(field.annotation))
        keys.append(KeyDoc(path, _type_name(field.annotation), _default(model, name), where,
                           description))
        nested = _nested_model(field.annotation)
        if nested:
            keys.extend(model_keys(nested[0], path + nested[1]))
    return keys


def _key_doc(annotation: object) -> str:
    """A check's own block (:class:`~paritygate.sections.Section`) says
    what its key is for in ``FIELD_DOC``."""
    nested = _nested_model(annotation)
    doc = getattr(nested[0], "FIELD_DOC", "") if nested else ""
    return _plain(doc) if isinstance(doc, str) and doc else ""


def _section_doc(annotation: object) -> str:
    nested = _nested_model(annotation)
    if not nested or not nested[0].__doc__:
        return ""
    return _plain(inspect.cleandoc(nested[0].__doc__).split("\n\n")[0])


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(keys: list[KeyDoc]) -> list[str]:
    rows = ["| key | type | default | defined in | meaning |", "|---|---|---|---|---|"]
    for key in keys:
        rows.append(f"| `{key.path}` | `{_cell(key.type)}` | {_cell(key.default)} | "
                    f"`{key.source}` | {_cell(key.description)} |")
    return rows


def threshold_rows(family: str) -> list[str]:
    """The family's checks and each threshold key with its declared default."""
    rows = ["| check | threshold key | default | defined in |", "|---|---|---|---|"]
    for spec in checks_for(family):
        for key, value in spec.defaults.items():
            rows.append(f"| `{spec.id}` | `{key}` | `{value:g}` | "
                        f"`paritygate.checks.{spec.id}.CHECK.defaults` |")
    return rows


def family_reference(family: str) -> str:
    """The whole generated reference of one family's gate config, as Markdown."""
    top = [k for k in model_keys(GateConfig)
           if k.path.split(".")[0].split("[")[0] not in (*FAMILIES, *COMMON_SECTIONS)]
    common = [k for k in model_keys(GateConfig) if k.path.split(".")[0] in COMMON_SECTIONS]
    own = [k for k in model_keys(GateConfig) if k.path.split(".")[0] == family]
    lines = [
        f"Every key of a `family: {family}` gate config, generated from the config models "
        "(`python -m paritygate.report.docgen`); a test keeps this page equal to the code.",
        "A default's *defined in* column names the model whose field declares it; `required` "
        "keys have none, `(section)` is a section whose keys are listed below it. A `Path` is "
        "written as a string, relative to the config file's folder (an absolute path stays as "
        "it is); it is resolved once, when the config loads.",
        "",
        "## Top-level keys", "", *_table(top), "",
        f"## `{family}:`", "", *_table(own), "",
        "## `golden:` and `precision:`", "", *_table(common), "",
        "## Thresholds", "",
        "`thresholds.<check>.<key>` overrides a check's default; `null` makes the metric "
        "informational. Each default is declared by its check; why each has its value is in "
        "[Default thresholds](../policy/thresholds.md).", "",
        *threshold_rows(family), "",
    ]
    return "\n".join(lines)


def reference_pages() -> dict[str, str]:
    """The generated blocks (block name -> Markdown), one per family."""
    return {f"config-{family}": family_reference(family) for family in FAMILIES}


