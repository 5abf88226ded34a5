"""The routing zoo: a tiny Qwen2-MoE (:mod:`moe_models`) and served copies of it, each with
one routing fault or none, plus rollout dumps carrying ``routed_experts``.

Every variant is a gate config dict over the clean model (training side) and a served copy
written here by editing the clean safetensors or config.json (never the clean files).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SAMPLING = REPO / "configs" / "sampling"
PROBES = REPO / "golden" / "demo-lm" / "probes.jsonl"


def base_config(model: Path, **lm: Any) -> dict[str, Any]:
    """A gate config over ``model`` with a routing block (the served copy set by a variant)."""
    return {
        "name": "moe", "family": "causal_lm", "seed": 0,
        "causal_lm": {
            "model_dir": str(model),
            "sampling": {"training": str(SAMPLING / "demo-lm-train.yaml"),
                         "serving": str(SAMPLING / "demo-lm-vllm.yaml")},
            "probes": str(PROBES), "engines": ["hf"], "routing": {}, **lm,
        },
    }


def _copy(model: Path, out: Path, edit: Callable[[dict[str, Any]], None] | None = None,
          config: Callable[[dict[str, Any]], None] | None = None) -> Path:
    """A served copy of ``model`` with its tensors (file names and layout as stored) and its
    config.json edited."""
    from safetensors.torch import load_file, save_file

    served = out / "served"
    shutil.copytree(model, served)
    if edit is not None:
        state = load_file(str(served / "model.safetensors"))
        edit(state)
        save_file({k: v.contiguous() for k, v in state.items()},
                  str(served / "model.safetensors"), metadata={"format": "pt"})
    if config is not None:
        data = json.loads((served / "config.json").read_text())
        config(data)
        (served / "config.json").write_text(json.dumps(data, indent=2))
    return served


def _serve(cfg: dict[str, Any], served: Path, **serving: Any) -> None:
    cfg["causal_lm"]["serving"] = {"model_dir": str(served), **serving}


def clean_copy(cfg: dict[str, Any], model: Path, out: Path) -> None:
    _serve(cfg, _copy(model, out))


def bf16_declared(cfg: dict[str, Any], model: Path, out: Path) -> None:
    """Clean: every served tensor stored in bfloat16, the serving dtype declared."""
    import torch

    def edit(state: dict[str, Any]) -> None:
        for k, v in state.items():
            state[k] = v.to(torch.bfloat16)
    _serve(cfg, _copy(model, out, edit), dtype="bfloat16")


def router_perturbed(cfg: dict[str, Any], model: Path, out: Path) -> None:
    """Layer 1's router moved by seeded noise of 20% of its scale (a stale or perturbed copy)."""
    import torch

    def edit(state: dict[str, Any]) -> None:
        key = "model.layers.1.mlp.gate.weight"
        gen = torch.Generator().manual_seed(0)
        noise = torch.randn(state[key].shape, generator=gen) * state[key].std() * 0.2
        state[key] = state[key] + noise
    _serve(cfg, _copy(model, out, edit))


def top_k_differs(cfg: dict[str, Any], model: Path, out: Path) -> None:
    """The served config routes each token to 3 experts instead of 2."""
    _serve(cfg, _copy(model, out, config=lambda c: c.update(num_experts_per_tok=3)))


def norm_differs(cfg: dict[str, Any], model: Path, out: Path) -> None:
    """The served config renormalises the top-k weights; the trainer does not."""
    _serve(cfg, _copy(model, out, config=lambda c: c.update(norm_topk_prob=True)))


def experts_permuted(cfg: dict[str, Any], model: Path, out: Path) -> None:
    """Layer 0's experts written in another order (a converter that sorted the expert keys
    as strings); the router rows stay."""
    order = [1, 0, 3, 2, 5, 4, 7, 6]

    def edit(state: dict[str, Any]) -> None:
        prefix = "model.layers.0.mlp.experts."
        moved = {k: v for k, v in state.items() if k.startswith(prefix)}
        for key, tensor in moved.items():
            index, rest = key[len(prefix):].split(".", 1)
            state[f"{prefix}{order[int(index)]}.{rest}"] = tensor
    _serve(cfg, _copy(model, out, edit))


def shared_expert_missing(cfg: dict[str, Any], model: Path, out: Path) -> None:
    """The served copy's converter dropped every shared-expert tensor."""
    def edit(state: dict[str, Any]) -> None:
        for key in [k for k in state if ".shared_expert." in k]:
            del state[key]
    _serve(cfg, _copy(model, out, edit))


@dataclass(frozen=True)
class Variant:
    name: str
    build: Callable[[dict[str, Any], Path, Path], None]
    kind: str | None
    """The finding kind the variant must fail with; ``None``: a clean twin that passes."""


VARIANTS = (
    Variant("clean_copy", clean_copy, None),
    Variant("bf16_declared", bf16_declared, None),
    Variant("router_perturbed", router_perturbed, "router_weights_differ"),
    Variant("top_k_differs", top_k_differs, "top_k_differs"),
    Variant("norm_differs", norm_differs, "topk_norm_differs"),
    Variant("experts_permuted", experts_permuted, "experts_permuted"),
    Variant("shared_expert_missing", shared_expert_missing, "shared_expert_missing"),
)


def write_routing_dump(model_dir: Path, path: Path, *, router_noise: float = 0.0,
                       drop: bool = False, bad_id: bool = False) -> Path:
    """A rollout dump of sampled continuations of the probes by the HF model of ``model_dir``,
    each record carrying the ``routed_experts`` the engine's own forward chose (its router
    moved by ``router_noise`` of its scale in layer 1; ``drop``: the second record without the
    field; ``bad_id``: one expert id out of range)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from paritygate.engines.hf_routing import moe_layout, positions, routed_forward

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if router_noise:
        weight = model.model.layers[1].mlp.gate.weight
        gen = torch.Generator().manual_seed(1)
        weight.data += torch.randn(weight.shape, generator=gen) * weight.std() * router_noise
    texts = [json.loads(line).get("text") for line in PROBES.read_text().splitlines()
             if line.strip()]
    prompts = [tok(text)["input_ids"] for text in texts if text][:4]
    records, seqs = [], []
    for ids in prompts:
        out = model.generate(torch.tensor([ids]), do_sample=True, max_new_tokens=8,
                             output_scores=True, return_dict_in_generate=True, top_k=0)
        completion = out.sequences[0, len(ids):].tolist()
        logps = [float(torch.log_softmax(s[0], -1)[t])
                 for s, t in zip(out.scores, completion, strict=True)]
        records.append({"prompt_ids": ids, "completion_ids": completion, "logprobs": logps,
                        "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": 0,
                                     "max_tokens": 8}, "logprobs_mode": "processed"})
        seqs.append(ids + completion)
    layout = moe_layout(model)
    assert layout is not None
    capture, mask = routed_forward(model, layout, seqs, tok.pad_token_id)
    every = mask | ~mask
    per_layer = [capture.layer(r, every)["experts"] for r in layout.routers]
    for rec, where in zip(records, positions(seqs), strict=True):
        rec["routed_experts"] = [[per_layer[li][p].tolist() for li in range(len(per_layer))]
                                 for p in where[:-1]]
    if bad_id:
        records[0]["routed_experts"][0][0][0] = layout.num_experts
    if drop:
        del records[1]["routed_experts"]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path
