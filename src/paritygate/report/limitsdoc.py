"""The bounds on what the gate reads, as one Markdown table generated from their constants.

Each bound is a module constant with a docstring saying where its number comes from; the
table (``docs/limits.md``, block ``limits``) shows its value and that docstring, so the docs
cannot drift from the code.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import itertools
import re

BOUNDS: tuple[tuple[str, str, str], ...] = (
    # (module, constant, what it bounds)
    ("paritygate.reading", "MAX_CONFIG_BYTES", "a gate config, a sampling or TRL config file"),
    ("paritygate.reading_text", "MAX_JSON_BYTES",
     "a JSON document read whole; a probes file"),
    ("paritygate.reading_text", "MAX_LINE_BYTES", "one line of a JSON-lines file"),
    ("paritygate.reading_text", "MAX_NESTING_DEPTH",
     "nesting of any JSON or YAML the gate parses"),
    ("paritygate.reading_text", "MAX_YAML_ALIAS_VALUES", "values YAML aliases add"),
    ("paritygate.reading", "MAX_ARRAY_BYTES", "array data a `.npy`/`.npz` declares"),
    ("paritygate.reading", "MAX_DUMP_BYTES", "a rollout dump file (each shard)"),
    ("paritygate.reading", "MAX_ZIP_RATIO",
     "a zip member's declared size over its compressed size (SB3 zip, torch zip checkpoint, "
     "TorchScript or `.pt2` artifact)"),
    ("paritygate.reading", "SPARSE_MIN_BYTES", "files judged for holes"),
    ("paritygate.reading", "SPARSE_MAX_HOLE_FRACTION", "holes in a file"),
    ("paritygate.sections.behaviour_parity", "MAX_BEHAVIOUR_SAMPLES",
     "`causal_lm.behaviour.samples`"),
    ("paritygate.config.causal_lm", "MAX_TOP_LOGPROBS", "`causal_lm.engine.top_logprobs`"),
    ("paritygate.config.causal_lm", "MAX_GENERATION_SAMPLES",
     "`causal_lm.generation_samples`"),
    ("paritygate.families.causal_lm.probes", "MAX_PROBES", "probes of `causal_lm.probes`"),
    ("paritygate.families.causal_lm.tokenizer", "MAX_TEMPLATE_BYTES",
     "a chat template file (`causal_lm.tokenizer.*_chat_template`)"),
    ("paritygate.families.causal_lm.reward", "MAX_COMPLETIONS",
     "records of `causal_lm.reward.completions`"),
    ("paritygate.families.causal_lm.sampling", "MAX_NEW_TOKENS",
     "`max_new_tokens`, `min_new_tokens` of a sampling config"),
    ("paritygate.families.causal_lm.sampling", "MAX_STOP_STRINGS",
     "stop strings in a sampling config"),
    ("paritygate.families.causal_lm.sampling", "MAX_STOP_CHARS", "one stop string"),
    ("paritygate.config.policy", "MAX_SERVING_LOG_RECORDS",
     "`policy.serving_log.max_records`"),
    ("paritygate.config.policy", "MAX_RECURRENT_STEPS", "`recurrent.steps`"),
    ("paritygate.config.policy", "MAX_RECURRENT_SEQUENCES", "`recurrent.sequences`"),
    ("paritygate.config.policy", "MAX_EPISODES",
     "`rollout.episodes` and the length of `rollout.seeds`"),
    ("paritygate.config.policy", "MAX_EPISODE_STEPS", "`rollout.max_steps`"),
    ("paritygate.trainer_output", "MAX_ALL_CHECKPOINTS",
     "`checkpoint-N` folders `paritygate run --all` gates"),
)


def constant_docs(module: str) -> dict[str, str]:
    """``{NAME: docstring}`` of a module's constants (the string literal after each
    assignment, as Sphinx reads attribute docstrings)."""
    tree = ast.parse(inspect.getsource(importlib.import_module(module)))
    docs: dict[str, str] = {}
    body = tree.body
    for node, after in itertools.pairwise(body):
        if (isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    docs[target.id] = " ".join(after.value.value.split())
    return docs


def show(name: str, value: object) -> str:
    """A bound's value as the docs print it (bytes in MiB/GiB)."""
    if name.endswith("_BYTES") and isinstance(value, int):
        return f"{value / 2**30:g} GiB" if value >= 2**30 else f"{value / 2**20:g} MiB"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def limits_table() -> str:
    """Every bound of :data:`BOUNDS`: constant, value, what it bounds, why this number."""
    rows = ["| bound | value | what it bounds | why this number |", "|---|---|---|---|"]
    docs: dict[str, dict[str, str]] = {}
    for module, name, what in BOUNDS:
        if module not in docs:
            docs[module] = constant_docs(module)
        value = getattr(importlib.import_module(module), name)
        why = docs[module].get(name, "").replace("``", "`").replace("|", "\\|")
        why = re.sub(r":(data|func|mod|class):`~?", "`", why)
        rows.append(f"| `{name}` | {show(name, value)} | {what} | {why} |")
    return "\n".join(rows) + "\n"
