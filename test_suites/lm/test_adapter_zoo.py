"""A LoRA policy (real peft, on the demo LM) served without its adapter or merged under another
lora_alpha: the root cause is the adapter, with the modules and the rank of the difference,
never another checkpoint. Its clean twin, the adapter re-merged at its training scale, passes
every LM check (``lora_merged`` in lm_zoo.CLEAN_VARIANTS).

With the training side declared as base + adapter (``causal_lm.adapter``), the cause is named
exactly: not merged, merged at another scale (c reported), or another adapter; an adapter that
does not fit the base, or is no adapter, is bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from lm_zoo import ADAPTER_FAULTS, LM_CHECKS, LORA_ALPHA, LORA_RANK

from paritygate.errors import InputError
from paritygate.families.causal_lm.build import build_lm_context
from paritygate.rootcause import explain

pytest.importorskip("peft")


@pytest.mark.parametrize("name", ["lora_base_served", "lora_other_scale"])
def test_an_adapter_merged_otherwise_is_named(lm_variants, name: str) -> None:
    weights = lm_variants.evaluate(name, "weights_load")
    assert weights.status == "fail"
    assert weights.finding_kinds() == ["adapter_difference"], weights.reasons
    assert "different checkpoint" not in weights.message
    assert "an adapter not merged, merged with another scale, or another adapter" in \
        weights.message
    adapter = weights.details["adapter_difference"]
    assert adapter["modules"] == ["q_proj", "v_proj"] and adapter["tensors"] == 4
    assert set(adapter["ranks"].values()) == {LORA_RANK}
    _, root = explain([lm_variants.evaluate(name, cid) for cid in LM_CHECKS])
    assert root is not None
    assert (root.check, root.kind, root.finding) == ("weights_load", "adapter_difference",
                                                     "adapter_difference")
    assert root.fix is not None and "lora_alpha" in root.fix
    assert {"logits_agreement", "logprob_delta"} <= set(root.explains)


# -- base + adapter declared (causal_lm.adapter): the cause named exactly -----------------------

@pytest.mark.parametrize("name", sorted(ADAPTER_FAULTS))
def test_a_declared_adapter_merged_otherwise_is_named_exactly(lm_variants, name: str) -> None:
    _, kind, scale, _ = ADAPTER_FAULTS[name]
    weights = lm_variants.evaluate(name, "weights_load")
    assert weights.status == "fail"
    assert weights.finding_kinds() == [kind], weights.reasons
    assert "adapter_difference" not in weights.details
    assert "different checkpoint" not in weights.message
    found = weights.details[kind]
    if kind == "adapter_on_other_base":  # the update whole, over another base's weights
        assert found["scale"] == pytest.approx(1.0, abs=0.02) and found["tensors"] == 4
        assert found["other_tensors_differing"] > 4
        _, root = explain([lm_variants.evaluate(name, cid) for cid in LM_CHECKS])
        assert root is not None and (root.check, root.kind) == ("weights_load", kind)
        assert {"logits_agreement", "logprob_delta"} <= set(root.explains)
        return
    assert found["modules"] == ["q_proj", "v_proj"] and found["tensors"] == 4
    if scale is not None:  # c: r/alpha when alpha/r was ignored, 2 when alpha was doubled
        assert found["scale"] == pytest.approx(scale, rel=1e-4)
        assert found["served_scale"] == pytest.approx(scale * LORA_ALPHA / LORA_RANK, rel=1e-4)
        assert found["declared_scale"] == LORA_ALPHA / LORA_RANK
        assert found["residual"] < 1e-4
        assert "applied twice" not in weights.message
    elif kind == "adapter_not_merged":
        assert found["scale"] == 0.0
    else:  # another adapter: no scale of this adapter's update explains it
        assert found["residual"] > 0.5
    assert weights.details["adapter"]["r"] == LORA_RANK
    assert weights.details["adapter"]["lora_alpha"] == LORA_ALPHA
    _, root = explain([lm_variants.evaluate(name, cid) for cid in LM_CHECKS])
    assert root is not None
    assert (root.check, root.kind, root.finding) == ("weights_load", kind, kind)
    assert {"logits_agreement", "logprob_delta"} <= set(root.explains)


@pytest.mark.parametrize("name", ["adapter_merged", "adapter_merged_bf16", "adapter_merged_in_bf16",
                                  "adapter_dir_merged"])
def test_base_plus_adapter_against_its_merged_copy_passes(lm_variants, name: str) -> None:
    """The clean twins (every LM check passes: CLEAN_CHECKS); here: the training side is the
    merged adapter, said so, and a bf16 merged copy is judged by its declared tier."""
    weights = lm_variants.evaluate(name, "weights_load")
    assert weights.status == "pass", weights.message
    notes = " ".join(weights.details["notes"])
    assert "merged in memory (peft merge_and_unload)" in notes
    assert "lora_alpha 8, r 4, scale 2" in notes
    if name == "adapter_merged_in_bf16":  # peft merged on a bf16 base: rounded twice
        assert "only within the rounding of merging in bfloat16" in notes
        assert len(weights.details["adapter_merged_in_served_dtype"]) == 4
    if name in ("adapter_merged_bf16", "adapter_merged_in_bf16"):
        assert "precision tier" in notes and "as the serving dtype bfloat16 declares" in notes
    else:
        assert weights.metrics["serving_tensors_differing"] == 0
    ctx = lm_variants.gate(name).context
    adapter = ctx.training.adapter
    assert adapter is not None and ctx.checkpoint_path == adapter.directory


# -- bad input -------------------------------------------------------------------------------

def _adapter_config(lm_variants, tmp_path: Path, edit: Any = None) -> Any:
    """A gate config declaring base + adapter, the adapter copied to tmp_path and edited."""
    from lm_zoo import Fault as ZooFault
    from lm_zoo import _adapter_serving, variant_config

    from paritygate.load import config_from_dict

    data = variant_config(lm_variants.model_dir, tmp_path / "out",
                          ZooFault("x", _adapter_serving("remerged"), {}))
    adapter = tmp_path / "adapter"
    shutil.copytree(data["causal_lm"]["adapter"], adapter)
    if edit is not None:
        edit(adapter)
    data["causal_lm"]["adapter"] = str(adapter)
    return config_from_dict(data, tmp_path / "gate.yaml")


def _resave(adapter: Path, change: Any) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(str(adapter / "adapter_model.safetensors"))
    change(state)
    save_file(state, str(adapter / "adapter_model.safetensors"))


def _other_hidden(state: dict[str, Any]) -> None:
    import torch

    key = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    state[key] = torch.zeros(LORA_RANK, 32)


def _other_vocab(state: dict[str, Any]) -> None:
    import torch

    state["base_model.model.model.embed_tokens.weight"] = torch.zeros(7, 64)


@pytest.mark.parametrize(("change", "said"), [
    (_other_hidden, "adapter tensor 'base_model.model.model.layers.0.self_attn.q_proj.lora_A."
                    "weight' has shape [4, 32], the base model's "
                    "'model.layers.0.self_attn.q_proj.weight' [64, 64] needs [4, 64]"),
    (_other_vocab, "'model.embed_tokens.weight'"),
])
def test_an_adapter_trained_on_another_base_is_bad_input(
        lm_variants, tmp_path: Path, change: Any, said: str) -> None:
    config = _adapter_config(lm_variants, tmp_path, lambda d: _resave(d, change))
    with pytest.raises(InputError) as refused:
        build_lm_context(config)
    assert refused.value.key == "causal_lm.adapter"
    assert str(refused.value.file) == str(tmp_path / "adapter" / "adapter_model.safetensors")
    assert "does not fit the base model" in refused.value.cause and said in refused.value.cause
    if change is _other_vocab:
        assert "(another vocabulary)" in refused.value.cause


def test_not_an_adapter_directory_exits_2_naming_the_key(
        lm_variants, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    from paritygate.cli import main

    config = _adapter_config(lm_variants, tmp_path,
                             lambda d: (d / "adapter_config.json").unlink())
    path = tmp_path / "gate.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json", exclude_none=True)))
    capsys.readouterr()  # what building the zoo's copies printed is not the run's output
    assert main(["run", str(path), "--report-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "causal_lm.adapter" in err[0] and "not a PEFT adapter directory" in err[0]
    assert "Traceback" not in err[0]


def test_a_pickled_adapter_is_refused(lm_variants, tmp_path: Path) -> None:
    def pickled(adapter: Path) -> None:
        (adapter / "adapter_model.safetensors").rename(adapter / "adapter_model.bin")

    with pytest.raises(InputError) as refused:
        build_lm_context(_adapter_config(lm_variants, tmp_path, pickled))
    assert refused.value.key == "causal_lm.adapter"
    assert "adapter_model.bin is pickle, never loaded" in refused.value.cause


def test_an_adapter_dir_as_model_dir_with_a_hub_base_says_what_to_set(
        lm_variants, tmp_path: Path) -> None:
    config = _adapter_config(lm_variants, tmp_path, lambda d: _edit_base(d, "org/some-base"))
    data = config.model_dump(mode="json", exclude_none=True)
    data["causal_lm"]["model_dir"] = data["causal_lm"].pop("adapter")
    from paritygate.load import config_from_dict

    with pytest.raises(InputError) as refused:
        build_lm_context(config_from_dict(data, tmp_path / "gate.yaml"))
    assert refused.value.key == "causal_lm.model_dir"
    assert "'org/some-base'" in refused.value.cause
    assert "set causal_lm.model_dir to the base model's local copy" in refused.value.cause


def test_a_missing_peft_names_the_extra(lm_variants, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "peft" else real(name, *a))
    with pytest.raises(InputError) as refused:
        build_lm_context(_adapter_config(lm_variants, tmp_path))
    assert refused.value.key == "causal_lm.adapter"
    assert "pip install 'paritygate[peft]'" in refused.value.cause


def _edit_base(adapter: Path, base: str) -> None:
    path = adapter / "adapter_config.json"
    data = json.loads(path.read_text())
    data["base_model_name_or_path"] = base
    path.write_text(json.dumps(data))


# -- init on an adapter directory --------------------------------------------------------------

@pytest.mark.parametrize("hub", [False, True])
def test_init_on_an_adapter_dir_fills_the_base(lm_variants, tmp_path: Path, hub: bool) -> None:
    from lm_zoo import _lora_build

    from paritygate import write_config

    adapter = tmp_path / "lora"
    shutil.copytree(_lora_build(lm_variants.model_dir, lm_variants.root) / "adapter", adapter)
    if hub:
        _edit_base(adapter, "org/some-base")
    written = write_config(adapter, out=tmp_path / "configs" / "lora.yaml", name="lora")
    import yaml

    section = yaml.safe_load(written.path.read_text())["causal_lm"]
    assert section["adapter"] == "../lora"
    if hub:
        assert written.todos[0] == "causal_lm.model_dir"
        assert "'org/some-base'" in section["model_dir"]
    else:
        assert "causal_lm.model_dir" not in written.todos
        assert (written.path.parent / section["model_dir"]).resolve() == \
            lm_variants.model_dir.resolve()
        assert section["training_only_heads"] == ["v_head."]


def test_without_a_served_copy_only_the_merged_model_itself_is_served(
        lm_variants, tmp_path: Path) -> None:
    """No serving.model_dir: the HF engine serves the merged training model (weights_load
    passes, nothing differs); a serving dtype or vLLM would load the base alone: bad input."""
    from paritygate.gate import Gate
    from paritygate.load import config_from_dict

    data = _adapter_config(lm_variants, tmp_path).model_dump(mode="json", exclude_none=True)
    data["causal_lm"].pop("serving")
    data["causal_lm"]["engine"].pop("model_dir", None)
    gate = Gate(config_from_dict(data, tmp_path / "gate.yaml"))
    weights = gate.evaluate("weights_load", golden=False)
    assert weights.status == "pass", weights.message
    assert weights.metrics["serving_tensors_differing"] == 0
    data["causal_lm"]["engine"]["dtype"] = "bfloat16"
    with pytest.raises(InputError) as refused:
        build_lm_context(config_from_dict(data, tmp_path / "gate.yaml"))
    assert refused.value.key == "causal_lm.serving.model_dir"
    assert "would serve the base without the adapter" in refused.value.cause


def test_the_base_served_with_the_training_adapter_passes(lm_variants) -> None:
    """``serving.adapter``: what vLLM's LoRA serves; the HF engine and weights_load merge it
    in memory, so it is the training policy (every LM check passes: CLEAN_CHECKS)."""
    weights = lm_variants.evaluate("adapter_served_lora", "weights_load")
    assert weights.status == "pass", weights.message
    assert "causal_lm.serving.adapter; vLLM serves it as a LoRA" in \
        " ".join(weights.details["notes"])
    assert weights.metrics["serving_tensors_differing"] == 0


def test_vllm_lora_engine_arguments() -> None:
    """The LoRA arguments vLLM gets (no vLLM needed): enable_lora, a max_lora_rank vLLM
    accepts at or above the adapter's rank, one adapter at a time."""
    from paritygate.engines.vllm_engine import VLLMEngine, vllm_lora_rank

    plain = VLLMEngine("base").llm_kwargs("cpu")
    assert "enable_lora" not in plain
    kwargs = VLLMEngine("base", lora_dir="lora", max_lora_rank=LORA_RANK).llm_kwargs("cpu")
    assert (kwargs["enable_lora"], kwargs["max_lora_rank"], kwargs["max_loras"]) == (True, 8, 1)
    assert [vllm_lora_rank(r) for r in (1, 4, 8, 9, 64, 65)] == [1, 8, 8, 16, 64, 128]


@pytest.mark.parametrize(("served_scale", "kind"), [
    (1.0, "merged_in_served_dtype"), (0.0, "adapter_not_merged"), (2.0, "adapter_scale_differs"),
    (0.5, "adapter_scale_differs"), (None, "adapter_mismatch")])
def test_a_bf16_served_copy_is_fit_through_its_rounding(served_scale: float | None,
                                                       kind: str) -> None:
    """bf16 rounding (uncorrelated with the update) neither hides the base served nor turns
    a copy merged in bf16 into a fault: c is read through the noise it adds."""
    import torch

    from paritygate.families.causal_lm.weights import adapter_fit

    gen = torch.Generator().manual_seed(0)
    base = {"q_proj.weight": torch.randn(64, 64, generator=gen) * 0.5}
    update = torch.randn(64, 4, generator=gen) @ torch.randn(4, 64, generator=gen) * 0.02
    merged = {"q_proj.weight": base["q_proj.weight"] + update}
    other = torch.randn(64, 4, generator=gen) @ torch.randn(4, 64, generator=gen) * 0.02
    change = other if served_scale is None else served_scale * update
    served = {"q_proj.weight": (base["q_proj.weight"] + change).to(torch.bfloat16)}
    fit = adapter_fit(base, merged, served, ["q_proj.weight"])
    assert fit is not None and fit.kind == kind, fit
    if kind == "adapter_scale_differs":
        assert fit.scale == pytest.approx(served_scale, abs=0.05)


def test_a_stale_copy_without_the_adapter_is_another_checkpoint(
        lm_variants, demo_lm: Path, tmp_path: Path) -> None:
    """Every tensor moved by the same noise as the other-base fault, but the adapter's update
    absent: the served copy is another checkpoint (``stale_engine_weights``), while the same
    moved weights with this adapter merged hold its update at c = 1 (``adapter_on_other_base``,
    the fault above): the kind follows the update measured on the targets."""
    from lm_zoo import Fault, _adapter_serving, variant_config

    from paritygate.gate import Gate
    from paritygate.load import config_from_dict

    out = tmp_path / "stale"
    out.mkdir()
    data = variant_config(demo_lm, out, Fault("stale", _adapter_serving("other-base-model"), {}))
    data["name"] = "adapter-stale"
    stale = Gate(config_from_dict(data, out / "gate.yaml")).evaluate("weights_load", golden=False)
    assert stale.status == "fail"
    assert stale.finding_kinds() == ["stale_served_weights"], stale.reasons
    _, root = explain([stale])
    assert root is not None and root.kind == "stale_engine_weights"
    merged = lm_variants.evaluate("adapter_on_other_base", "weights_load")
    assert merged.finding_kinds() == ["adapter_on_other_base"], merged.reasons
    assert "moved after merging" in merged.message
