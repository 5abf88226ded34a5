"""``paritygate init`` for the RL loop around a causal LM: the ``reward`` and ``reference``
blocks, from ``--reward-model`` / ``--reference`` or from directories found beside the
checkpoint. Reads ``config.json`` and ``tokenizer_config.json`` only; what it cannot know (the
initial policy, the trainer's KL estimator) is TODO."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paritygate.errors import InputError
from paritygate.init_policy import Written

if TYPE_CHECKING:
    from paritygate.init_yaml import Block

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


def rl_blocks(
    lm: Block, source: Path, written: Written, reward_model: Path | None, reference: Path | None
) -> list[str]:
    """The ``reward`` and ``reference`` blocks under ``causal_lm``, and notes on where each
    directory came from."""
    notes: list[str] = []
    found = reward_model is None
    reward = reward_model or _beside(source, REWARD_NAMES)
    beside = " (found beside the checkpoint)" if found else ""
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
            block = lm.block("reward", "reward_parity" + beside)
            block.set("model_dir", written.rel(reward), "the copy that scores at evaluation")
            block.comment("trained_dir: the reward model as training used it (default: "
                          "model_dir)")
            block.set("training", {"padding_side": tok.get("padding_side", "right")},
                      "how training scored (TRL: right, EOS appended)")
            block.comment("serving: {padding_side: ..., max_length: ...}   # default: as "
                          "training")
            notes.append(f"reward model {reward}" + (" found beside the checkpoint" if found
                                                     else ""))
    found = reference is None
    beside = " (found beside the checkpoint)" if found else ""
    ref = reference or _beside(source, REFERENCE_NAMES)
    if ref is not None:
        block = lm.block("reference", "reference_parity" + beside)
        block.set("model_dir", written.rel(ref))
        block.todo("initial", "the initial policy's directory, or its sha256 at step 0")
        block.todo("kl_estimator", "k1 | k2 | k3 | your trainer's module:callable"
                   "(logp, logp_ref, mask)")
        notes.append(f"KL reference {ref}" + (" found beside the checkpoint" if found else ""))
    return notes
