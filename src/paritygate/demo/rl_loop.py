"""The RL loop around the demo LM: a reward model and a KL reference, so the demo shows
``reward_parity`` and ``reference_parity`` (``configs/demo-rl-loop.yaml``).

- ``lm/initial``: the initial (SFT) policy the RL run started from: the demo LM with every
  matrix moved by a small seeded step, as an RL run moves it; the demo LM is the policy at the
  step under test.
- ``lm/reference``: the KL reference as the trainer loads it (a copy of the initial policy).
- ``lm/reward``: a one-label Llama classifier on the demo tokenizer, trained for a few steps to
  score corpus lines above their shuffled words (the Bradley-Terry loss of TRL's
  ``RewardTrainer``), saved as ``RewardTrainer`` saves one.

Deterministic for a given seed; a few seconds on CPU.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

REWARD_STEPS = 40
"""Training steps of the reward model (batch 16): enough to rank lines over shuffled words."""

INITIAL_STEP = 0.05
"""How far the initial policy sits from the demo LM: each matrix moved by this fraction of its
own spread (a KL of a few hundredths of a nat per token on the probes)."""


def build_reference(lm_dir: Path, model: Any, tokenizer: Any, seed: int = 0) -> None:
    """Write ``lm_dir/initial`` and ``lm_dir/reference`` from the trained demo ``model``."""
    import copy

    import torch

    initial = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for param in initial.parameters():
            if param.dim() == 2:
                param.add_(torch.randn(param.shape, generator=gen) * param.std() * INITIAL_STEP)
    for name in ("initial", "reference"):
        initial.save_pretrained(lm_dir / name)
        tokenizer.save_pretrained(lm_dir / name)


def build_reward(lm_dir: Path, tok: Any, lines: list[str], seed: int = 0) -> None:
    """Train and write ``lm_dir/reward`` on the demo tokenizer ``tok`` and corpus ``lines``."""
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification

    torch.manual_seed(seed)
    rng = random.Random(seed)
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
        num_labels=1, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id)
    model = LlamaForSequenceClassification(config)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    padding_side, tok.padding_side = tok.padding_side, "right"
    model.train()
    for _ in range(REWARD_STEPS):
        chosen = rng.sample(lines, 16)
        rejected = [" ".join(rng.sample(ln.split(), len(ln.split()))) for ln in chosen]
        batch = tok([c + tok.eos_token for c in chosen + rejected], return_tensors="pt",
                    padding=True, add_special_tokens=False)
        scores = model(**batch).logits.squeeze(-1)  # (2B,)
        loss = -torch.nn.functional.logsigmoid(scores[:16] - scores[16:]).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    tok.padding_side = padding_side
    model.save_pretrained(lm_dir / "reward")
    tok.save_pretrained(lm_dir / "reward")
