"""Registry of causal-LM faults: each derives a faulty gate config from the clean demo.

A variant never touches the clean demo: it writes modified copies (tokenizer
directory, sampling YAML, chat template, stale weights) into its own folder.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from copy import deepcopy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from zoo_checks import zoo_checks

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "demo-lm.yaml"
LM_CHECKS = zoo_checks("causal_lm")
"""The checks of the LM zoo's faults, derived from the registry."""

Patch = Callable[[dict[str, Any], Path, Path], None]
"""(config dict to edit, clean demo model dir, this variant's folder)."""


def clean_config(model_dir: Path) -> dict[str, Any]:
    """The committed demo config with its paths made absolute (model from ``model_dir``)."""
    data = yaml.safe_load(CONFIG.read_text())
    lm = data["causal_lm"]
    lm["model_dir"] = str(model_dir)
    lm["tokenizer"] = {"training": str(model_dir), "serving": str(model_dir)}
    for side in ("training", "serving"):
        lm["sampling"][side] = str((CONFIG.parent / lm["sampling"][side]).resolve())
    lm["probes"] = str((CONFIG.parent / lm["probes"]).resolve())
    data.pop("golden", None)
    return data


def _sampling(cfg: dict[str, Any], side: str, out: Path, **changes: Any) -> None:
    src = Path(cfg["causal_lm"]["sampling"][side])
    values = yaml.safe_load(src.read_text())
    values.update(changes)
    dst = out / f"sampling-{side}.yaml"
    dst.write_text(yaml.safe_dump(values))
    cfg["causal_lm"]["sampling"][side] = str(dst)


def _serving_tokenizer(
    cfg: dict[str, Any], model: Path, out: Path, edit: Callable[[Path], None]
) -> None:
    tok_dir = out / "serving-tokenizer"
    tok_dir.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (model / name).exists():
            shutil.copy(model / name, tok_dir / name)
    edit(tok_dir)
    cfg["causal_lm"]["tokenizer"]["serving"] = str(tok_dir)


def _edit_json(path: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def pads_counted(cfg: dict[str, Any], model: Path, out: Path) -> None:
    cfg["causal_lm"]["training"]["logprob_fn"] = "lm_zoo_logprobs:pads_counted"


def off_by_one(cfg: dict[str, Any], model: Path, out: Path) -> None:
    cfg["causal_lm"]["training"]["logprob_fn"] = "lm_zoo_logprobs:off_by_one"


def temperature_one_side(cfg: dict[str, Any], model: Path, out: Path) -> None:
    _sampling(cfg, "training", out, temperature=0.7)
    _sampling(cfg, "serving", out, temperature=0.7)
    cfg["causal_lm"]["training"]["logprobs_mode"] = "raw"


def right_padding(cfg: dict[str, Any], model: Path, out: Path) -> None:
    def edit(d: Path) -> None:
        _edit_json(d / "tokenizer_config.json", lambda c: c.update(padding_side="right"))

    _serving_tokenizer(cfg, model, out, edit)


def temperature_differs(cfg: dict[str, Any], model: Path, out: Path) -> None:
    _sampling(cfg, "serving", out, temperature=0.8)


def max_new_tokens_differs(cfg: dict[str, Any], model: Path, out: Path) -> None:
    _sampling(cfg, "serving", out, max_tokens=8)


def stop_strings_missing(cfg: dict[str, Any], model: Path, out: Path) -> None:
    _sampling(cfg, "training", out, stop=["."])


def no_bos(cfg: dict[str, Any], model: Path, out: Path) -> None:
    def edit(d: Path) -> None:
        _edit_json(d / "tokenizer.json", lambda c: c.update(post_processor=None))

    _serving_tokenizer(cfg, model, out, edit)


def other_chat_template(cfg: dict[str, Any], model: Path, out: Path) -> None:
    template = out / "serving-template.jinja"
    template.write_text(
        "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n"
        "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    cfg["causal_lm"]["tokenizer"]["serving_chat_template"] = str(template)


def bf16_vs_fp32_tier(cfg: dict[str, Any], model: Path, out: Path) -> None:
    cfg["causal_lm"]["engine"]["dtype"] = "bfloat16"
    cfg["causal_lm"]["precision_tier"] = "fp32/fp32"


def value_head_undeclared(cfg: dict[str, Any], model: Path, out: Path) -> None:
    cfg["causal_lm"]["training_only_heads"] = []


def stale_checkpoint(cfg: dict[str, Any], model: Path, out: Path) -> None:
    """The engine serves a copy whose weights are one optimiser step's worth away."""
    import torch
    from safetensors.torch import load_file, save_file

    stale = out / "stale-model"
    shutil.copytree(model, stale)
    state = load_file(str(stale / "model.safetensors"))
    gen = torch.Generator().manual_seed(1)
    for name, tensor in state.items():
        if tensor.dim() == 2 and not name.startswith("v_head."):
            noise = torch.randn(tensor.shape, generator=gen) * tensor.std() * 0.02
            state[name] = (tensor + noise).contiguous()
    save_file(state, str(stale / "model.safetensors"), metadata={"format": "pt"})
    cfg["causal_lm"]["engine"]["model_dir"] = str(stale)


def nan_weight(cfg: dict[str, Any], model: Path, out: Path) -> None:
    """One weight of the model under test is NaN (a diverged optimiser step): every logit is."""
    from safetensors.torch import load_file, save_file

    broken = out / "nan-model"
    shutil.copytree(model, broken)
    state = load_file(str(broken / "model.safetensors"))
    name = next(k for k in sorted(state) if k.endswith("mlp.down_proj.weight"))
    state[name][0, 0] = float("nan")
    save_file(state, str(broken / "model.safetensors"), metadata={"format": "pt"})
    cfg["causal_lm"]["model_dir"] = str(broken)


def _serving_copy(model: Path, out: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """A serving export of the demo: value head stripped, then ``edit`` applied to the state."""
    from safetensors.torch import load_file, save_file

    served = out / "serving-model"
    shutil.copytree(model, served)
    state = load_file(str(served / "model.safetensors"))
    state = {k: v for k, v in state.items() if not k.startswith("v_head.")}
    edit(state)
    save_file(state, str(served / "model.safetensors"), metadata={"format": "pt"})
    return served


def stale_serving(cfg: dict[str, Any], model: Path, out: Path) -> None:
    """The serving section points at an export of an older step (every matrix moved)."""
    import torch

    def edit(state: dict[str, Any]) -> None:
        gen = torch.Generator().manual_seed(2)
        for name, tensor in state.items():
            if tensor.dim() == 2:
                noise = torch.randn(tensor.shape, generator=gen) * tensor.std() * 0.02
                state[name] = (tensor + noise).contiguous()

    cfg["causal_lm"]["serving"] = {"model_dir": str(_serving_copy(model, out, edit))}


def bf16_serving_copy(cfg: dict[str, Any], model: Path, out: Path) -> None:
    """The served export stores every weight in bfloat16; the gate's serving dtype is fp32."""

    def edit(state: dict[str, Any]) -> None:
        import torch

        for name, tensor in state.items():
            if tensor.is_floating_point():
                state[name] = tensor.to(torch.bfloat16).contiguous()

    cfg["causal_lm"]["serving"] = {"model_dir": str(_serving_copy(model, out, edit))}


def bf16_declared(cfg: dict[str, Any], model: Path, out: Path) -> None:
    """Clean: a bfloat16 serving copy that the config declares (``serving.dtype``): judged by
    the bf16/fp32 precision tier, not as staleness or a sampling difference."""
    bf16_serving_copy(cfg, model, out)
    cfg["causal_lm"]["serving"]["dtype"] = "bfloat16"
    cfg["causal_lm"]["engine"].pop("dtype", None)


def _saved_copy(
    model: Path, out: Path, *, dtype: str = "float32", temperature: float | None = None,
    padding_side: str | None = None,
) -> Path:
    """The served copy as an export script writes it: the demo loaded by transformers (value
    head dropped), cast to ``dtype``, and written by ``save_pretrained`` with its tokenizer and
    generation config (``temperature``, the tokenizer's ``padding_side`` changed if given)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    served = out / f"served-{dtype}"
    lm = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    lm = lm.to(getattr(torch, dtype))
    if temperature is not None:
        lm.generation_config.temperature = temperature
    lm.save_pretrained(served)
    tokenizer = AutoTokenizer.from_pretrained(model)
    if padding_side is not None:
        tokenizer.padding_side = padding_side
    tokenizer.save_pretrained(served)
    return served


def _names_training_files(cfg: dict[str, Any], model: Path, served: Path) -> None:
    """Serve ``served`` with the training directory's sampling file and tokenizer named as the
    serving ones: what ``paritygate init`` wrote before the served directory's own files
    became the serving defaults."""
    cfg["causal_lm"]["serving"] = {"model_dir": str(served)}
    cfg["causal_lm"]["sampling"]["serving"] = str(model / "generation_config.json")
    cfg["causal_lm"]["tokenizer"]["serving"] = str(model)


def served_sampling_contradicts(cfg: dict[str, Any], model: Path, out: Path) -> None:
    """The copy that ships samples at temperature 0.7 (its own generation_config.json); the
    config names the training directory's file (temperature 1.0) as the serving one."""
    _names_training_files(cfg, model, _saved_copy(model, out, temperature=0.7))


def served_sampling_agrees(cfg: dict[str, Any], model: Path, out: Path) -> None:
    """Clean: as served_sampling_contradicts, but the shipped generation config agrees."""
    _names_training_files(cfg, model, _saved_copy(model, out))


def served_sampling_allowed(cfg: dict[str, Any], model: Path, out: Path) -> None:
    """Clean: as served_sampling_contradicts, with the engine really started on the declared
    file (vLLM ``--generation-config``): accepted by an allow-list entry with its reason."""
    served_sampling_contradicts(cfg, model, out)
    cfg["causal_lm"]["sampling"]["allow"] = [
        {"field": "served_dir", "reason": "the server starts with --generation-config ckpt/"}]


def served_tokenizer_contradicts(cfg: dict[str, Any], model: Path, out: Path) -> None:
    """The copy that ships pads on the right (its own tokenizer_config.json); the config names
    the training directory's tokenizer (left padding) as the serving one."""
    _names_training_files(cfg, model, _saved_copy(model, out, padding_side="right"))


def bf16_saved_declared(cfg: dict[str, Any], model: Path, out: Path) -> None:
    """Clean: a bfloat16 copy written by save_pretrained (config.json dtype bfloat16), declared
    by ``serving.dtype``: every check judges it by the bf16/fp32 tier."""
    cfg["causal_lm"]["serving"] = {"model_dir": str(_saved_copy(model, out, dtype="bfloat16")),
                                   "dtype": "bfloat16"}
    cfg["causal_lm"]["engine"].pop("dtype", None)
    cfg["causal_lm"]["tokenizer"].pop("serving")
    cfg["causal_lm"]["sampling"].pop("serving")


def bf16_saved_own_dtype(cfg: dict[str, Any], model: Path, out: Path) -> None:
    """Clean: the same bfloat16 copy with no dtype in the gate config: the served directory's
    own config.json (dtype bfloat16) is the serving dtype."""
    bf16_saved_declared(cfg, model, out)
    cfg["causal_lm"]["serving"].pop("dtype")


def serving_eos_differs(cfg: dict[str, Any], model: Path, out: Path) -> None:
    """The served generation_config.json ends responses at '.' instead of the tokenizer's EOS:
    HF generate stops on the generation config's eos_token_id."""
    from transformers import AutoTokenizer

    serving_export(cfg, model, out)
    served = Path(cfg["causal_lm"]["serving"]["model_dir"])
    period = AutoTokenizer.from_pretrained(served).convert_tokens_to_ids(".")
    path = served / "generation_config.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["eos_token_id"] = period
    path.write_text(json.dumps(data), encoding="utf-8")


def serving_export(cfg: dict[str, Any], model: Path, out: Path) -> None:
    """Clean: a separate serving export (value head stripped, every tensor bit-identical) with
    its own tokenizer and generation_config.json, named only in the serving section."""
    served = _serving_copy(model, out, lambda state: None)
    cfg["causal_lm"]["serving"] = {"model_dir": str(served), "engine": "hf"}
    cfg["causal_lm"]["tokenizer"].pop("serving")
    cfg["causal_lm"]["sampling"].pop("serving")


LORA_RANK = 4
LORA_ALPHA = 8
"""The adapter the LoRA policy was trained with: scale lora_alpha / r = 2 on q_proj and v_proj."""


def _lora_build(model: Path, root: Path) -> Path:
    """Once per variants root: a LoRA policy built with peft on the demo LM (the training
    checkpoint: the adapter merged at its training scale) and the served copies a user might
    ship beside it (base only, merged under another lora_alpha, merged at scale 1 (lora_alpha
    / r ignored), another adapter, re-merged from the saved adapter, that merge saved in
    bfloat16). Each copy is the demo's directory with its weights replaced."""
    build = root / "lora-build"
    if (build / "done").exists():
        return build
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    def base() -> Any:
        return AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()

    def config(alpha: int) -> LoraConfig:
        return LoraConfig(r=LORA_RANK, lora_alpha=alpha, lora_dropout=0.0,
                          target_modules=["q_proj", "v_proj"])

    def save(name: str, state: dict[str, Any], head: dict[str, Any]) -> None:
        folder = build / name
        shutil.copytree(model, folder)
        tensors = {k: v.detach().contiguous() for k, v in {**state, **head}.items()}
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})

    head = {k: v for k, v in load_file(str(model / "model.safetensors")).items()
            if k.startswith("v_head.")}
    torch.manual_seed(3)
    policy = get_peft_model(base(), config(LORA_ALPHA))
    gen = torch.Generator().manual_seed(3)
    for name, param in policy.named_parameters():
        if "lora_B" in name:  # a trained adapter (peft starts B at zero)
            param.data = torch.randn(param.shape, generator=gen) * 0.05
    adapter = {k: v.detach().clone() for k, v in policy.state_dict().items() if "lora_" in k}
    policy.save_pretrained(build / "adapter")
    save("policy", policy.merge_and_unload().state_dict(), head)  # the checkpoint under test
    save("base", base().state_dict(), {})
    other = get_peft_model(base(), config(2 * LORA_ALPHA))
    other.load_state_dict(adapter, strict=False)
    save("other-scale", other.merge_and_unload().state_dict(), {})
    again = PeftModel.from_pretrained(base(), build / "adapter")
    merged = again.merge_and_unload()
    save("remerged", merged.state_dict(), {})
    shutil.copytree(model, build / "merged-bf16")
    (build / "merged-bf16" / "model.safetensors").unlink()
    merged.to(torch.bfloat16).save_pretrained(build / "merged-bf16")
    shutil.copytree(model, build / "merged-in-bf16")  # peft merging on a bf16 base
    (build / "merged-in-bf16" / "model.safetensors").unlink()
    on_bf16 = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16).eval()
    PeftModel.from_pretrained(on_bf16, build / "adapter").merge_and_unload().save_pretrained(
        build / "merged-in-bf16")
    ignored = get_peft_model(base(), config(LORA_RANK))  # scale 1: alpha / r dropped
    ignored.load_state_dict(adapter, strict=False)
    save("alpha-ignored", ignored.merge_and_unload().state_dict(), {})
    another = get_peft_model(base(), config(LORA_ALPHA))
    gen = torch.Generator().manual_seed(11)
    for name, param in another.named_parameters():
        if "lora_" in name:
            param.data = torch.randn(param.shape, generator=gen) * 0.05
    save("another-adapter", another.merge_and_unload().state_dict(), {})
    torch.manual_seed(5)  # another base (a sibling fine-tune), the same adapter merged on it
    sibling = base()
    with torch.no_grad():
        for param in sibling.parameters():
            param.add_(torch.randn_like(param) * 0.01)
    shutil.copytree(model, build / "other-base-model")
    save_file({k: v.contiguous() for k, v in sibling.state_dict().items()},
              str(build / "other-base-model" / "model.safetensors"), metadata={"format": "pt"})
    save("other-base", PeftModel.from_pretrained(sibling, build / "adapter")
         .merge_and_unload().state_dict(), {})
    shutil.copytree(build / "adapter", build / "adapter-alpha16")  # served with alpha doubled
    _edit_json(build / "adapter-alpha16" / "adapter_config.json",
               lambda data: data.update(lora_alpha=2 * LORA_ALPHA))
    (build / "done").write_text("ok")
    return build


def _lora_serving(served: str) -> Patch:
    def patch(cfg: dict[str, Any], model: Path, out: Path) -> None:
        build = _lora_build(model, out.parent)
        cfg["causal_lm"]["model_dir"] = str(build / "policy")
        cfg["causal_lm"]["serving"] = {"model_dir": str(build / served)}

    patch.__name__ = f"lora_{served}"
    return patch


def _adapter_serving(served: str, *, adapter_as_model_dir: bool = False,
                     dtype: str | None = None) -> Patch:
    """The training side declared as base + adapter (``causal_lm.adapter``, or the adapter
    directory as ``model_dir`` with its base from adapter_config.json), served as ``served``."""
    def patch(cfg: dict[str, Any], model: Path, out: Path) -> None:
        build = _lora_build(model, out.parent)
        if adapter_as_model_dir:
            cfg["causal_lm"]["model_dir"] = str(build / "adapter")
        else:
            cfg["causal_lm"]["model_dir"] = str(model)
            cfg["causal_lm"]["adapter"] = str(build / "adapter")
        if served == "adapter-on-other-base":  # the adapter served on another base
            cfg["causal_lm"]["serving"] = {"model_dir": str(build / "other-base-model"),
                                           "adapter": str(build / "adapter")}
        elif served.startswith("adapter"):  # base + adapter served (vLLM LoRA; merged for HF)
            cfg["causal_lm"]["serving"] = {"model_dir": str(model), "adapter": str(build / served)}
        elif served == "BASE":  # the training base folder itself named as what ships
            cfg["causal_lm"]["serving"] = {"model_dir": str(model)}
        else:
            cfg["causal_lm"]["serving"] = {"model_dir": str(build / served)}
        if dtype is not None:
            cfg["causal_lm"]["serving"]["dtype"] = dtype
            cfg["causal_lm"]["engine"].pop("dtype", None)
        cfg["causal_lm"]["tokenizer"].pop("serving", None)
        cfg["causal_lm"]["sampling"].pop("serving", None)

    patch.__name__ = f"adapter_{served}"
    return patch


ADAPTER_FAULTS: dict[str, tuple[str, str, float | None, str]] = {
    "adapter_base_served": ("base", "adapter_not_merged", None, "the adapter is not merged"),
    # serving.model_dir names the training base folder itself: served as its files
    "adapter_base_dir_served": ("BASE", "adapter_not_merged", None,
                                "the adapter is not merged"),
    "adapter_alpha_ignored": ("alpha-ignored", "adapter_scale_differs", LORA_RANK / LORA_ALPHA,
                              "at scale s = 1 on 4 of the adapter's 4 target tensors (q_proj, "
                              "v_proj), not the declared lora_alpha / r = 8 / 4 = 2 (c = 0.5 "
                              "times the trained update; lora_alpha / r ignored"),
    "adapter_merged_twice": ("other-scale", "adapter_scale_differs", 2.0,
                             "at scale s = 4 on 4 of the adapter's 4 target tensors (q_proj, "
                             "v_proj), not the declared lora_alpha / r = 8 / 4 = 2 (c = 2 times "
                             "the trained update; as if lora_alpha were 16 for r 4"),
    "adapter_another": ("another-adapter", "adapter_mismatch", None,
                        "another adapter was merged"),
    "adapter_served_alpha_doubled": ("adapter-alpha16", "adapter_scale_differs", 2.0,
                                     "at scale s = 4 on 4 of the adapter's 4 target tensors"),
    "adapter_on_other_base": ("other-base", "adapter_on_other_base", None,
                              "holds this adapter's update (c = 1.000"),
    "adapter_lora_on_other_base": ("adapter-on-other-base", "adapter_on_other_base", None,
                                   "the adapter was merged onto another base"),
}
"""Base + adapter declared, a served copy merged otherwise: (served copy, the kind
weights_load names, the scale c it reports, what its message says)."""
ADAPTER_ALSO_FAIL: dict[str, tuple[str, ...]] = {
    "adapter_base_served": ("logits_agreement", "logprob_delta"),
    "adapter_alpha_ignored": ("logits_agreement", "logprob_delta"),
    "adapter_merged_twice": ("logits_agreement", "logprob_delta", "generation_parity"),
    "adapter_another": ("logits_agreement", "logprob_delta"),
    "adapter_served_alpha_doubled": ("logits_agreement", "logprob_delta", "generation_parity"),
    "adapter_base_dir_served": ("logits_agreement", "logprob_delta"),
    "adapter_on_other_base": ("logits_agreement", "logprob_delta", "generation_parity"),
    "adapter_lora_on_other_base": ("logits_agreement", "logprob_delta", "generation_parity"),
}


def sampling_wrong_format(cfg: dict[str, Any], model: Path, out: Path) -> None:
    """The served generation_config.json is declared a vLLM file: HF fields read as vLLM's."""
    cfg["causal_lm"]["sampling"]["serving"] = str(model / "generation_config.json")
    cfg["causal_lm"]["sampling"]["serving_format"] = "vllm"


def trainer_json(cfg: dict[str, Any], model: Path, out: Path) -> None:
    """Clean: the trainer's sampling config is a .json (trainer fields, no HF markers);
    it is read in the trainer format, not as an HF generation_config with HF's defaults."""
    src = Path(cfg["causal_lm"]["sampling"]["training"])
    dst = out / "trainer-sampling.json"
    dst.write_text(json.dumps(yaml.safe_load(src.read_text())))
    cfg["causal_lm"]["sampling"]["training"] = str(dst)


def bf16_trainer(cfg: dict[str, Any], model: Path, out: Path) -> None:
    """The trainer's recompute in bfloat16 (as most RL trainers run): its padding and batch
    layouts move a correct function's log-probs by bf16 rounding, never a mask bug."""
    cfg["causal_lm"]["training"]["dtype"] = "bfloat16"


def _bf16_trainer_with(patch: Patch) -> Patch:
    def both(cfg: dict[str, Any], model: Path, out: Path) -> None:
        bf16_trainer(cfg, model, out)
        patch(cfg, model, out)

    return both


def _logprob_fn(name: str) -> Patch:
    def patch(cfg: dict[str, Any], model: Path, out: Path) -> None:
        cfg["causal_lm"]["training"]["logprob_fn"] = f"lm_zoo_logprobs:{name}"

    patch.__name__ = name
    return patch


def _trainer_fn(name: str, *, temperature: float | None = None) -> Patch:
    """A trainer's own log-prob code (:mod:`trainer_logprobs`), at the demo's temperature or
    with both sides sampling at ``temperature``."""

    def patch(cfg: dict[str, Any], model: Path, out: Path) -> None:
        cfg["causal_lm"]["training"]["logprob_fn"] = f"trainer_logprobs:{name}"
        if temperature is not None:
            _sampling(cfg, "training", out, temperature=temperature)
            _sampling(cfg, "serving", out, temperature=temperature)

    patch.__name__ = name
    return patch


def min_p_one_side(cfg: dict[str, Any], model: Path, out: Path) -> None:
    _sampling(cfg, "serving", out, min_p=0.05)


def eos_as_stop(cfg: dict[str, Any], model: Path, out: Path) -> None:
    """Clean: the server lists the EOS token as a stop string, the trainer relies on EOS."""
    _sampling(cfg, "serving", out, stop=["</s>"])


def temperature_ignored_sampled(cfg: dict[str, Any], model: Path, out: Path) -> None:
    """Both sides sample at T=0.8, but the trainer's log-prob function ignores temperature."""
    _sampling(cfg, "training", out, temperature=0.8)
    _sampling(cfg, "serving", out, temperature=0.8)
    cfg["causal_lm"]["training"]["logprob_fn"] = "lm_zoo_logprobs:temperature_ignored"


def penalty_both(**fields: Any) -> Patch:
    """Both sides sample under the same penalty: agreed, and still off-policy."""
    def patch(cfg: dict[str, Any], model: Path, out: Path) -> None:
        _sampling(cfg, "training", out, **fields)
        _sampling(cfg, "serving", out, **fields)
    return patch


repetition_penalty_both = penalty_both(repetition_penalty=1.3)
presence_penalty_both = penalty_both(presence_penalty=1.5)


def repetition_penalty_declared(cfg: dict[str, Any], model: Path, out: Path) -> None:
    """The clean twin: the trainer's log-prob function applies the same repetition penalty
    and the config declares it."""
    penalty_both(repetition_penalty=1.3)(cfg, model, out)
    cfg["causal_lm"]["training"]["logprob_fn"] = "lm_zoo_logprobs:repetition_penalised"
    cfg["causal_lm"]["training"]["logprob_applies"] = ["repetition_penalty"]


def _served_generation_config(**fields: Any) -> Patch:
    """Serve the demo's export under vLLM with its own generation_config.json (the serving
    config by default): the demo's (EOS ids, ``max_new_tokens``) with ``fields`` set
    (``None``: left out)."""
    def patch(cfg: dict[str, Any], model: Path, out: Path) -> None:
        served = _serving_copy(model, out, lambda state: None)
        path = served / "generation_config.json"
        data = {**json.loads(path.read_text()), **fields}
        path.write_text(json.dumps({k: v for k, v in data.items() if v is not None}))
        cfg["causal_lm"]["serving"] = {"model_dir": str(served)}
        cfg["causal_lm"]["sampling"].pop("serving")
        cfg["causal_lm"]["engines"] = ["vllm"]
    return patch


served_temperature_vllm = _served_generation_config(temperature=0.7)
"""Fault: the served generation_config.json samples at 0.7, which vLLM applies as its default
(the trainer samples at 1.0)."""
served_hf_defaults_vllm = _served_generation_config(top_k=None, do_sample=None,
                                                    min_new_tokens=0)
"""Clean twin: the served file leaves ``top_k`` and ``do_sample`` out (HF would apply top-k 50
and decode greedily) and states HF's default ``min_new_tokens``: vLLM applies none of them, no
top-k (the trainer's ``top_k: -1``), sampling at the stated temperature 1.0."""

served_no_eos_vllm = _served_generation_config(eos_token_id=None)
"""Clean twin under vLLM: the served generation_config.json states no ``eos_token_id``; vLLM
stops on the tokenizer's EOS whatever the file says."""


def served_no_eos_hf(cfg: dict[str, Any], model: Path, out: Path) -> None:
    """Fault: the same file served by HF ``generate``, which stops on the generation config's
    EOS ids only: with none stated, responses run on past the EOS token."""
    served_no_eos_vllm(cfg, model, out)
    cfg["causal_lm"]["engines"] = ["hf"]


@dataclass(frozen=True)
class Fault:
    """A fault, the checks it must fail with the cause each names, and the other checks
    that also fail on it (asserted too, so this table stays true)."""

    name: str
    patch: Patch
    causes: dict[str, str]
    also_fail: tuple[str, ...] = ()


FAULTS: tuple[Fault, ...] = (
    Fault(
        "pads_counted",
        pads_counted,
        {"logprob_impl": "pads counted"},
        # The recompute attends to left pads, so batched rows drift from the engine's.
        ("logprob_delta",),
    ),
    Fault(
        "off_by_one",
        off_by_one,
        {"logprob_impl": "off-by-one shift"},
        # Scores the wrong token: the trainer's log-probs are unrelated to the engine's.
        ("logprob_delta",),
    ),
    Fault("temperature_one_side", temperature_one_side, {"logprob_delta": "log-prob modes differ"}),
    Fault(
        "right_padding",
        right_padding,
        {"tokenizer_parity": "pads on the right"},
        # padding_side is also a sampling-protocol field (training left, serving right);
        # right-padded batches make the engine continue from pad tokens (batch_invariance names
        # the layout).
        ("sampling_config", "logprob_delta", "generation_parity", "batch_invariance"),
    ),
    Fault(
        "temperature_differs",
        temperature_differs,
        {"sampling_config": "temperature differs: training 1.0 vs serving 0.8"},
        # The engine reports log-probs at T=0.8, the trainer recomputes at T=1.0.
        ("logprob_delta",),
    ),
    Fault(
        "max_new_tokens_differs",
        max_new_tokens_differs,
        {"sampling_config": "max_new_tokens differs: training 16 vs serving 8"},
        # Greedy responses longer than 8 tokens are cut on the engine side only.
        ("generation_parity",),
    ),
    Fault(
        "stop_strings_missing",
        stop_strings_missing,
        {"sampling_config": "stop differs: training ['.'] vs serving []"},
        # The training path stops at '.', the engine runs on.
        ("generation_parity",),
    ),
    Fault("no_bos", no_bos, {"tokenizer_parity": "serving tokenizer does not add BOS"}),
    Fault(
        "other_chat_template", other_chat_template, {"tokenizer_parity": "chat template differs"}
    ),
    Fault(
        "serving_eos_differs",
        serving_eos_differs,
        {"sampling_config": "eos_token_id differs"},
        # the engine stops at '.', the training path at the tokenizer's EOS
        ("generation_parity",),
    ),
    Fault(
        "bf16_vs_fp32_tier",
        bf16_vs_fp32_tier,
        {"logprob_delta": "precision mismatch: trainer float32 vs engine bfloat16"},
        # The declared engine dtype is a precision change, not a sampling difference; the
        # pinned fp32/fp32 tier holds bf16 logits to logits_agreement's fp32 bound, and bf16
        # flips one greedy token of the demo (probe 'empty', margin 0.036) for generation_parity;
        # bf16's batch-shaped reductions (0.0078 nats) exceed the pinned tier in batch_invariance.
        ("logits_agreement", "generation_parity", "batch_invariance"),
    ),
    Fault(
        "value_head_undeclared",
        value_head_undeclared,
        {"weights_load": "not declared training-only"},
    ),
    Fault(
        "stale_checkpoint",
        stale_checkpoint,
        {"weights_load": "stale or different checkpoint"},
        # Log-probs move by ~0.03 nats; the peaked greedy argmax does not flip, so
        # generation_parity passes: logits_agreement and logprob_delta see it.
        ("logits_agreement", "logprob_delta"),
    ),
)


FAULTS += (
    Fault(
        "nan_weight",
        nan_weight,
        {
            "weights_load": "has 1 NaN/Inf values",
            "logprob_impl": "non-finite logits from the training model",
            "logprob_delta": "non-finite logits from the served model (engine hf) during sampling",
            "generation_parity": "non-finite logits from the served model (engine hf) during "
            "greedy decoding",
        },
        # Every logit is NaN: the logits comparison is non-finite on both sides, and
        # batch_invariance's batched decode meets the same NaN logits.
        ("logits_agreement", "batch_invariance"),
    ),
    Fault(
        "stale_serving",
        stale_serving,
        {"weights_load": "serving weights differ from the checkpoint under test"},
        ("logits_agreement", "logprob_delta"),
    ),
    Fault(
        "bf16_serving_copy",
        bf16_serving_copy,
        {"weights_load": "precision change: the served copy stores"},
        ("logits_agreement", "logprob_delta"),
    ),
    Fault(
        "sampling_wrong_format",
        sampling_wrong_format,
        {"sampling_config": "in the wrong format"},
    ),
    Fault(
        "min_p_one_side",
        min_p_one_side,
        {"sampling_config": "min_p differs"},
        # The HF engine's processed log-probs renormalise over the min-p set; the trainer's do not.
        ("logprob_delta",),
    ),
    Fault(
        "temperature_ignored",
        _logprob_fn("temperature_ignored"),
        {"logprob_impl": "temperature ignored"},
    ),
    Fault(
        "prompt_only_mask",
        _logprob_fn("prompt_only_mask"),
        {"logprob_impl": "pads after EOS scored"},
    ),
    Fault(
        "mask_not_passed",
        _logprob_fn("mask_not_passed"),
        {"logprob_impl": "the attention mask is not applied"},
        # the recompute attends to the left pads of batched rows
        ("logprob_delta",),
    ),
    Fault(
        "mask_not_passed_bf16_trainer",
        _bf16_trainer_with(_logprob_fn("mask_not_passed")),
        {"logprob_impl": "the attention mask is not applied"},
        # the recompute attends to the left pads of batched rows
        ("logprob_delta",),
    ),
    Fault(
        "off_by_one_next",
        _logprob_fn("off_by_one_next"),
        {"logprob_impl": "off-by-one shift: logits[:, 1:] scored against input_ids[:, 1:]"},
        ("logprob_delta",),
    ),
    Fault(
        "served_sampling_contradicts",
        served_sampling_contradicts,
        {"sampling_config": "generation_config.json (differing: temperature 1.0 vs 0.7)"},
    ),
    Fault(
        "served_tokenizer_contradicts",
        served_tokenizer_contradicts,
        {"tokenizer_parity": "(differing: padding_side 'left' vs 'right')"},
    ),
    Fault(
        "trl_grpo_bf16",
        _trainer_fn("trl_grpo_bf16"),
        {"logprob_impl": "computes in bfloat16"},
        ("logprob_delta",),
    ),
    *(Fault(name, _adapter_serving(served), {"weights_load": text}, ADAPTER_ALSO_FAIL[name])
      for name, (served, _, _, text) in ADAPTER_FAULTS.items()),
    Fault(
        "lora_base_served",
        _lora_serving("base"),
        {"weights_load": "differs from training by a low-rank update on 4 modules (q_proj, "
                         "v_proj)"},
        ("logits_agreement", "logprob_delta"),
    ),
    Fault(
        "lora_other_scale",
        _lora_serving("other-scale"),
        {"weights_load": "differs from training by a low-rank update on 4 modules (q_proj, "
                         "v_proj)"},
        # twice the adapter's update flips greedy tokens too
        ("logits_agreement", "logprob_delta", "generation_parity"),
    ),
)

CLEAN_VARIANTS: tuple[Fault, ...] = (
    Fault("serving_export", serving_export, {}),
    Fault("bf16_declared", bf16_declared, {}),
    Fault("bf16_saved_declared", bf16_saved_declared, {}),
    Fault("bf16_saved_own_dtype", bf16_saved_own_dtype, {}),
    Fault("served_sampling_agrees", served_sampling_agrees, {}),
    Fault("served_sampling_allowed", served_sampling_allowed, {}),
    Fault("trainer_json", trainer_json, {}),
    Fault("eos_as_stop", eos_as_stop, {}),
    Fault("bf16_trainer", bf16_trainer, {}),
    Fault("trl_logits_adapter", _logprob_fn("trl_style_logits"), {}),
    # Rotary positions: a function without position ids is off by rounding only.
    Fault("no_position_ids_rotary", _logprob_fn("no_position_ids"), {}),
    Fault("trl_grpo", _trainer_fn("trl_grpo"), {}),
    Fault("trl_grpo_t07", _trainer_fn("trl_grpo", temperature=0.7), {}),
    Fault("trl_ppo", _trainer_fn("trl_ppo"), {}),
    Fault("verl_response", _trainer_fn("verl_response"), {}),
    Fault("verl_response_t07", _trainer_fn("verl_response", temperature=0.7), {}),
    # the LoRA policy served as the adapter re-merged at its training scale
    Fault("lora_merged", _lora_serving("remerged"), {}),
    # base + adapter declared, served as the correctly merged copy (fp32; bf16 declared), and
    # the adapter directory as model_dir (its base from adapter_config.json)
    Fault("adapter_merged", _adapter_serving("remerged"), {}),
    Fault("adapter_merged_bf16", _adapter_serving("merged-bf16", dtype="bfloat16"), {}),
    Fault("adapter_merged_in_bf16", _adapter_serving("merged-in-bf16", dtype="bfloat16"), {}),
    Fault("adapter_dir_merged", _adapter_serving("remerged", adapter_as_model_dir=True), {}),
    # the base served with the training adapter on it (vLLM LoRA; merged in memory for HF)
    Fault("adapter_served_lora", _adapter_serving("adapter"), {}),
)
"""Correct setups that look like faults: the checks in CLEAN_CHECKS must pass on them."""
CLEAN_CHECKS: dict[str, tuple[str, ...]] = {
    "serving_export": LM_CHECKS,
    "bf16_declared": LM_CHECKS,
    "bf16_saved_declared": LM_CHECKS,
    "bf16_saved_own_dtype": LM_CHECKS,
    "served_sampling_agrees": LM_CHECKS,
    "served_sampling_allowed": ("sampling_config",),
    "trainer_json": ("sampling_config", "logprob_delta", "generation_parity"),
    "eos_as_stop": ("sampling_config", "generation_parity"),
    "bf16_trainer": ("logprob_impl",),
    "trl_logits_adapter": ("logprob_impl", "logprob_delta"),
    "no_position_ids_rotary": ("logprob_impl", "logprob_delta"),
    "trl_grpo": ("logprob_impl", "logprob_delta"),
    "trl_grpo_t07": ("logprob_impl", "logprob_delta"),
    "trl_ppo": ("logprob_impl",),
    "verl_response": ("logprob_impl",),
    "verl_response_t07": ("logprob_impl", "logprob_delta"),
    "lora_merged": LM_CHECKS,
    "adapter_merged": LM_CHECKS,
    "adapter_merged_bf16": LM_CHECKS,
    "adapter_merged_in_bf16": LM_CHECKS,
    "adapter_dir_merged": LM_CHECKS,
    "adapter_served_lora": LM_CHECKS,
}


def variant_config(model_dir: Path, out: Path, fault: Fault | None) -> dict[str, Any]:
    cfg = deepcopy(clean_config(model_dir))
    if fault is not None:
        fault.patch(cfg, model_dir, out)
    return cfg


VLLM_FAULTS: tuple[str, ...] = (
    "repetition_penalty_both",
    "temperature_differs",
    "temperature_ignored_sampled",
    "stale_serving",
    "bf16_serving_copy",
)
"""Served faults ``vllm_delta`` must catch with the causes ``logprob_delta`` (HF engine) names
(test_vllm_real.py; the HF side of each is in FAULTS, or below)."""
VLLM_ONLY_FAULTS: tuple[Fault, ...] = (
    Fault("temperature_ignored_sampled", temperature_ignored_sampled, {}),
)
"""Variants only the vLLM comparison runs (looked up by name with FAULTS)."""
SAMPLING_VARIANTS: tuple[Fault, ...] = (
    Fault("repetition_penalty_both", repetition_penalty_both,
          {"sampling_config": "repetition_penalty (serving 1.3, training 1.3) moves the sampled "
                              "distribution away from the policy",
           "logprob_delta": "a penalty on repeated tokens"}),
    Fault("repetition_penalty_declared", repetition_penalty_declared, {}),
)
"""The sampling model's fault and its clean twin (test_sampling_zoo.py on HF,
test_vllm_real.py on vLLM): both sides agree on a penalty, and the declared trainer function
that applies it."""

