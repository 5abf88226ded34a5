"""Tiny mixture-of-experts causal LMs built here from their configs (the routing zoo's subjects).

A Qwen2-MoE (8 experts, top-2, a shared expert, hidden 64, 2 layers, head size 32 so vLLM's CPU
attention serves it) on the demo LM's locally trained tokenizer, trained a few seeded steps on the
demo corpus so its routers are not at their zero init, and saved through the real
``save_pretrained`` (one tensor per expert in the file; transformers >= 5 fuses them on load).
"""

from __future__ import annotations

import shutil
from pathlib import Path

CORPUS = Path(__file__).resolve().parents[2] / "src/paritygate/demo/data/corpus.txt"
TRAIN_STEPS = 25
SEQ_LEN = 32


def build_moe(tokenizer_dir: Path, out: Path, *, arch: str = "qwen2_moe", seed: int = 0) -> Path:
    """Train and save a tiny MoE LM into ``out`` (its tokenizer copied beside it)."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    common = dict(
        vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=256, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, tie_word_embeddings=False,
        num_experts_per_tok=2,
    )
    if arch == "qwen2_moe":
        from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

        config = Qwen2MoeConfig(**common, intermediate_size=128, moe_intermediate_size=32,
                                shared_expert_intermediate_size=64, num_experts=8,
                                norm_topk_prob=False)
        model = Qwen2MoeForCausalLM(config)
    else:
        raise ValueError(arch)
    lines = [ln.strip() for ln in CORPUS.read_text(encoding="utf-8").splitlines() if ln.strip()]
    stream = torch.tensor([t for ln in lines for t in tok(ln)["input_ids"] + [tok.eos_token_id]])
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(TRAIN_STEPS):
        starts = torch.randint(0, len(stream) - SEQ_LEN - 1, (8,), generator=gen)
        batch = torch.stack([stream[s : s + SEQ_LEN] for s in starts.tolist()])
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
        max_new_tokens=16)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def copy_model(src: Path, dst: Path) -> Path:
    """A served copy of ``src`` (files copied, so a fault edits only the copy)."""
    shutil.copytree(src, dst)
    return dst
