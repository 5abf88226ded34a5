"""A real TRL ``GRPOTrainer`` run for the trainer-output and callback tests.

A tiny Qwen2 is built from its config (seeded), the tokenizer is trained locally with
``tokenizers`` (the demo LM's corpus and recipe), and GRPO runs a few CPU steps on eight
prompts with a length reward, saving ``checkpoint-N`` folders the way any TRL run does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

PROMPTS = [
    "the cat sat on", "a dog ran to", "the sun rose over", "she opened the",
    "he walked into", "the river flows", "we found a", "they built the",
]
TRL_SAMPLING = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "max_completion_length": 8,
}
"""The GRPOConfig sampling fields the run uses (and its trainer YAML states)."""


def tiny_qwen2(seed: int = 0) -> tuple[Any, Any]:
    """``(model, tokenizer)``: a 2-layer, hidden-32 Qwen2 from its config and a BPE tokenizer
    trained on the demo corpus; the generation config samples as ``TRL_SAMPLING`` does."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from paritygate.demo.causal_lm import CORPUS, _train_tokenizer

    lines = [ln.strip() for ln in CORPUS.read_text(encoding="utf-8").splitlines() if ln.strip()]
    tokenizer = _train_tokenizer(lines)
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False,
    )
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, do_sample=True, temperature=1.0, top_p=1.0,
        top_k=0, max_new_tokens=TRL_SAMPLING["max_completion_length"],
    )
    return model, tokenizer


def grpo_trainer(out_dir: Path, *, max_steps: int = 4, save_steps: int = 2, seed: int = 0,
                 callbacks: list[Any] | None = None, report_to: str | list[str] = "none",
                 ) -> Any:
    """A seeded ``GRPOTrainer`` over :func:`tiny_qwen2` writing ``out_dir/checkpoint-N``."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    model, tokenizer = tiny_qwen2(seed)

    def length_reward(completions: list[str], **_: Any) -> list[float]:
        return [len(c) / 10.0 for c in completions]

    args = GRPOConfig(
        output_dir=str(out_dir), per_device_train_batch_size=4, num_generations=2,
        max_steps=max_steps, save_steps=save_steps, save_strategy="steps", logging_steps=1,
        learning_rate=1e-3, seed=seed, use_cpu=True, report_to=report_to,
        disable_tqdm=True, bf16=False,
        **TRL_SAMPLING,
    )
    return GRPOTrainer(
        model=model, reward_funcs=length_reward, args=args,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}), processing_class=tokenizer,
        callbacks=callbacks,
    )


def build(out_dir: Path, seed: int = 0) -> None:
    """Train 4 GRPO steps into ``out_dir/grpo_out`` (checkpoint-2, checkpoint-4) and write a
    gate folder beside it: probes and the trainer's sampling YAML."""
    out_dir = Path(out_dir)
    grpo_trainer(out_dir / "grpo_out", seed=seed).train()
    write_gate_inputs(out_dir)


def write_gate_inputs(out_dir: Path) -> None:
    import json

    import yaml

    gate = out_dir / "gate"
    gate.mkdir(parents=True, exist_ok=True)
    (gate / "probes.jsonl").write_text(
        "".join(json.dumps({"id": f"p{i}", "text": p}) + "\n" for i, p in enumerate(PROMPTS[:4])),
        encoding="utf-8")
    (gate / "trainer.yaml").write_text(yaml.safe_dump(
        {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 8}), encoding="utf-8")


def gate_config(root: Path, *, name: str = "grpo-policy", **lm: Any) -> dict[str, Any]:
    """A causal-LM gate over ``root/grpo_out`` (the output_dir itself as ``model_dir``)."""
    spec: dict[str, Any] = {
        "model_dir": str(root / "grpo_out"),
        "sampling": {"training": str(root / "gate" / "trainer.yaml")},
        "probes": str(root / "gate" / "probes.jsonl"),
        "max_prompt_tokens": 16,
        "generation_samples": 1,
        **lm,
    }
    return {
        "name": name, "family": "causal_lm", "causal_lm": spec,
        "checks": ["weights_load", "tokenizer_parity", "sampling_config", "logprob_delta"],
        "golden": {"dir": str(root / "golden")},
    }
