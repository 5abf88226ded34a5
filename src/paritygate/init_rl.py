"""``paritygate init`` for the RL loop around a causal LM: the ``reward`` and ``reference``
blocks, from ``--reward-model`` / ``--reference`` or from directories found beside the
checkpoint. Reads ``config.json`` and ``tokenizer_config.json`` only; what it cannot know (the
initial policy, the trainer's KL estimator) is TODO."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from paritygate.errors import InputError
from paritygate.init_infer import TODO
from paritygate.init_infer import relative as _rel
from paritygate.init_infer import yaml_scalar as _q

REWARD_NAMES = ("reward_model", "reward", "rm")
REFERENCE_NAMES = ("ref_model", "reference", "ref")
"""Folder names looked for beside the checkpoint's directory (TRL and common scripts)."""


def _config(directory: Path) -> dict[str, Any]:
    try:
        data = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _is_classifier(directory: Path) -> bool:
    archs = _config(directory).get("architectures") or []
    return any(str(a).endswith("ForSequenceClassification") for a in archs)


def _beside(source: Path, names: tuple[str, ...]) -> Path | None:
    for name in names:
        candidate = source.parent / name
        if candidate != source and (candidate / "config.json").is_file():
            return candidate
    return None


def rl_loop_lines(
    source: Path, base: Path, reward_model: Path | None, reference: Path | None
) -> tuple[list[str], list[str]]:
    """Config lines of the ``reward`` and ``reference`` blocks (indented under ``causal_lm``)
    and notes on where each directory came from."""
    lines: list[str] = []
    notes: list[str] = []
    found = reward_model is None
    reward = reward_model or _beside(source, REWARD_NAMES)
    if reward is not None:
        if not _is_classifier(reward):
            if not found:
                raise InputError(reward, "--reward-model",
                                 "not a sequence-classification model directory "
                                 "(config.json architectures ...ForSequenceClassification)")
        else:
            tok = {}
            if (reward / "tokenizer_config.json").is_file():
                tok = json.loads((reward / "tokenizer_config.json").read_text(encoding="utf-8"))
            side = tok.get("padding_side", "right")
            lines += [
                "  reward:   # reward_parity" + (" (found beside the checkpoint)" if found else ""),
                f"    model_dir: {_rel(reward, base)}   # the copy that scores at evaluation",
                "    # trained_dir: the reward model as training used it (default: model_dir)",
                f"    training: {{padding_side: {side}}}   # how training scored (TRL: right, "
                "EOS appended)",
                "    # serving: {padding_side: ..., max_length: ...}   # default: as training",
            ]
            notes.append(f"reward model {reward}" + (" found beside the checkpoint" if found
                                                     else ""))
    found = reference is None
    ref = reference or _beside(source, REFERENCE_NAMES)
    if ref is not None:
        lines += [
            "  reference:   # reference_parity" + (" (found beside the checkpoint)" if found
                                                   else ""),
            f"    model_dir: {_rel(ref, base)}",
            "    initial: " + _q(f"{TODO}: the initial policy's directory, or its sha256 at "
                                 "step 0"),
            "    kl_estimator: " + _q(f"{TODO}: k1 | k2 | k3 | your trainer's module:callable"
                                      "(logp, logp_ref, mask)"),
        ]
        notes.append(f"KL reference {ref}" + (" found beside the checkpoint" if found else ""))
    return lines, notes
