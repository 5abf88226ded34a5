"""The RL loop around the demo LM: a reward model and a KL reference, so the demo shows
``reward_parity`` and ``reference_parity`` (``configs/demo-rl-loop.yaml``).

- ``lm/initial``: the policy the run started from: the demo LM's seeded initialisation, saved
  before its training steps (the same tensors on every machine, so the reference's digest is a
  baseline that holds); the demo LM is the policy at the step under test.
- ``lm/reference``: the KL reference as the trainer loads it (a copy of the initial policy).
- ``lm/reward``: a one-label Llama classifier on the demo tokenizer, trained for a few steps to
  score corpus lines above their shuffled words (the Bradley-Terry loss of TRL's
  ``RewardTrainer``), saved as ``RewardTrainer`` saves one.

Deterministic for a given seed; a few seconds on CPU.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

REWARD_STEPS = 40
"""Training steps of the reward model (batch 16): enough to rank lines over shuffled words."""

def build_reference(lm_dir: Path, initial: PreTrainedModel,
                    tokenizer: PreTrainedTokenizerBase) -> None:
    """Write ``lm_dir/initial`` and ``lm_dir/reference``: the demo LM as it was before training
    (``initial``, its seeded initialisation), the policy the run started from."""
    for name in ("initial", "reference"):
        initial.save_pretrained(lm_dir / name)
        tokenizer.save_pretrained(lm_dir / name)


def build_reward(lm_dir: Path, tok: PreTrainedTokenizerBase, lines: list[str],
                 seed: int = 0) -> None:
    """Train and write ``lm_dir/reward`` on the demo tokenizer ``tok`` and corpus ``lines``."""
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification

    torch.manual_seed(seed)
    rng = random.Random(seed)
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
        pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id)
    config.num_labels = 1  # one score: a reward head
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
