"""Demo causal LM: a tiny Llama trained on a bundled corpus, saved as a Hugging Face directory.

The directory has everything the causal-LM family reads: ``config.json``,
``model.safetensors`` (with a TRL-style value head ``v_head.summary.*`` that only
the trainer uses), a locally trained BPE tokenizer with a chat template, and a
``generation_config.json``. Training runs a few hundred steps so next-token
distributions are peaked, like a real LM's, which makes log-prob deltas meaningful.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

CORPUS = Path(__file__).parent / "data" / "corpus.txt"

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>{{ message['content'] }}{{ eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
VOCAB_SIZE = 512
HIDDEN = 64
LAYERS = 2
HEADS = 2  # head_dim 32: a head size vLLM's CPU attention supports (32, 64, 80, ...)
MAX_POSITIONS = 256
TRAIN_STEPS = 250
SEQ_LEN = 48
BATCH = 16


def _train_tokenizer(lines: list[str]):  # -> PreTrainedTokenizerFast
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer=trainer)
    bos_id = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos_id)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        additional_special_tokens=SPECIAL_TOKENS[4:],
        padding_side="left",
        truncation_side="left",
        chat_template=CHAT_TEMPLATE,
        model_max_length=MAX_POSITIONS,
    )


def _token_stream(tokenizer, lines: list[str]) -> list[int]:
    """Corpus as ``<s> line </s>`` records plus a few chat-formatted records."""
    stream: list[int] = []
    for i, line in enumerate(lines):
        stream += tokenizer(line)["input_ids"] + [tokenizer.eos_token_id]
        if i % 10 == 0 and i + 1 < len(lines):
            chat = [
                {"role": "user", "content": line},
                {"role": "assistant", "content": lines[i + 1]},
            ]
            stream += list(tokenizer.apply_chat_template(chat, tokenize=True, return_dict=False))
    return stream


def build(out_dir: Path, seed: int = 0) -> None:
    """Build the demo LM into ``out_dir/model`` (deterministic for a given seed)."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    from paritygate.progress import Progress

    out_dir = Path(out_dir)
    model_dir = out_dir / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    lines = [ln.strip() for ln in CORPUS.read_text(encoding="utf-8").splitlines() if ln.strip()]
    tokenizer = _train_tokenizer(lines)
    stream = torch.tensor(_token_stream(tokenizer, lines), dtype=torch.long)

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN,
        intermediate_size=4 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    initial = copy.deepcopy(model)  # the policy before training: the RL loop's KL reference
    value_head = torch.nn.Linear(HIDDEN, 1)
    opt = torch.optim.AdamW(
        [*model.parameters(), *value_head.parameters()], lr=3e-3, weight_decay=0.0
    )
    gen = torch.Generator().manual_seed(seed)
    model.train()
    bar = Progress("demo LM: training", TRAIN_STEPS)
    for _ in range(TRAIN_STEPS):
        starts = torch.randint(0, len(stream) - SEQ_LEN - 1, (BATCH,), generator=gen)
        batch = torch.stack([stream[s : s + SEQ_LEN + 1] for s in starts.tolist()])  # (B, T+1)
        out = model(input_ids=batch[:, :-1], labels=batch[:, :-1], output_hidden_states=True)
        # Stand-in value target (per-token return proxy) so the value head is a trained head.
        values = value_head(out.hidden_states[-1].detach()).squeeze(-1)  # (B, T)
        target = (batch[:, 1:] == tokenizer.eos_token_id).float()
        loss = out.loss + 0.1 * torch.nn.functional.mse_loss(values, target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        bar.advance()
    bar.close()
    model.eval()

    entropy = mean_entropy(model, stream[: 32 * SEQ_LEN].view(32, SEQ_LEN))
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_new_tokens=16,
    )
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    state["v_head.summary.weight"] = value_head.weight.detach().clone()
    state["v_head.summary.bias"] = value_head.bias.detach().clone()
    from paritygate.progress import use_bar

    if not use_bar():  # transformers draws its own shard bar: keep CI logs free of escape codes
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    model.save_pretrained(model_dir, state_dict=state)
    tokenizer.save_pretrained(model_dir)
    from paritygate.demo import rl_loop

    rl_loop.build_reference(out_dir, initial, tokenizer)
    rl_loop.build_reward(out_dir, tokenizer, lines, seed)
    print(
        f"demo LM: mean next-token entropy {entropy:.3f} nats "
        f"(uniform log(vocab) = {math.log(len(tokenizer)):.3f}), saved to {model_dir}"
    )


def mean_entropy(model, input_ids) -> float:
    """Mean entropy (nats) of the model's next-token distributions over ``input_ids``."""
    import torch

    with torch.no_grad():
        logits = model(input_ids=input_ids).logits.float()  # (B, T, V)
    logp = torch.log_softmax(logits, dim=-1)
    return float(-(logp.exp() * logp).sum(-1).mean())
