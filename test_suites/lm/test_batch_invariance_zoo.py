"""Fault zoo of ``batch_invariance``: each serving fault fails with its named kind, and each
has a clean twin that passes. The faults run the real HF model (the demo LM, rotary
positions; a GPT-2 with learned absolute positions for position ids) through the serving
batch layout of :mod:`lm_zoo_serving` or the served tokenizer's padding side."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from lm_zoo import Patch, right_padding, variant_config

from paritygate.checks.batch_invariance import KINDS


def _collate(name: str) -> Patch:
    def patch(cfg: dict[str, Any], model: Path, out: Path) -> None:
        cfg["causal_lm"]["engine"]["collate"] = f"lm_zoo_serving:{name}"

    return patch


def _gpt2(then: Patch | None = None) -> Patch:
    """A GPT-2 (learned absolute positions) built from its config with the demo's tokenizer."""

    def patch(cfg: dict[str, Any], model: Path, out: Path) -> None:
        import torch
        from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

        folder = out / "gpt2"
        folder.mkdir(exist_ok=True)
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                     "chat_template.jinja", "generation_config.json"):
            if (model / name).exists():
                shutil.copy(model / name, folder / name)
        tok = AutoTokenizer.from_pretrained(folder)
        config = GPT2Config(vocab_size=len(tok), n_positions=256, n_embd=32, n_layer=2,
                            n_head=2, initializer_range=0.2, bos_token_id=tok.bos_token_id,
                            eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        torch.manual_seed(0)
        GPT2LMHeadModel(config).eval().save_pretrained(folder)
        lm = cfg["causal_lm"]
        lm["model_dir"] = str(folder)
        lm["tokenizer"] = {"training": str(folder), "serving": str(folder)}
        lm["training_only_heads"] = []
        if then is not None:
            then(cfg, model, out)

    return patch


def _bf16(declared: bool) -> Patch:
    def patch(cfg: dict[str, Any], model: Path, out: Path) -> None:
        cfg["causal_lm"]["engine"]["dtype"] = "bfloat16"
        if declared:
            cfg["causal_lm"].setdefault("serving", {})["batch_invariant"] = True

    return patch


def _declared(cfg: dict[str, Any], model: Path, out: Path) -> None:
    cfg["causal_lm"].setdefault("serving", {})["batch_invariant"] = True


@dataclass(frozen=True)
class Entry:
    name: str
    patch: Patch | None
    kind: str | None
    """The finding kind the faulty subject fails with; ``None``: a clean twin, it passes."""
    twin: str | None = None


ZOO: tuple[Entry, ...] = (
    Entry("clean", None, None),
    # the served tokenizer pads on the right: HF generate continues from pads
    Entry("right_padding", right_padding, "right_padding", twin="clean"),
    Entry("right_padded_collate", _collate("right_padded"), "right_padding", twin="clean"),
    Entry("mask_not_passed", _collate("mask_not_passed"), "mask_not_passed", twin="clean"),
    Entry("gpt2_clean", _gpt2(), None),
    Entry("position_ids_not_from_mask", _gpt2(_collate("positions_not_from_mask")),
          "position_ids_not_from_mask", twin="gpt2_clean"),
    # rotary positions enter only relatively: a shifted start does not move the numbers
    Entry("rotary_positions_not_from_mask", _collate("positions_not_from_mask"), None),
    # bf16 batch-dependent reductions: noise within the bf16 tier unless invariance is declared
    Entry("bf16_noise", _bf16(declared=False), None),
    Entry("bf16_declared_invariant", _bf16(declared=True), "not_bitwise", twin="bf16_noise"),
    # HF on CPU is not bitwise invariant even in fp32 (~1e-6 nats): a declared claim fails
    Entry("fp32_declared_invariant", _declared, "not_bitwise", twin="clean"),
)


class Zoo:
    def __init__(self, model_dir: Path, root: Path) -> None:
        self.model_dir, self.root = model_dir, root
        self._results: dict[str, Any] = {}
        self._gates: dict[str, Any] = {}

    def gate(self, name: str) -> Any:
        from paritygate.gate import Gate
        from paritygate.load import config_from_dict

        if name not in self._gates:
            entry = next(e for e in ZOO if e.name == name)
            out = self.root / name
            out.mkdir(parents=True, exist_ok=True)
            data = variant_config(self.model_dir, out, None)
            if entry.patch is not None:
                entry.patch(data, self.model_dir, out)
            data["name"] = f"bi-{name}".replace("_", "-")
            self._gates[name] = Gate(config_from_dict(data, out / "gate.yaml"))
        return self._gates[name]

    def evaluate(self, name: str) -> Any:
        if name not in self._results:
            self._results[name] = self.gate(name).evaluate("batch_invariance", golden=False)
        return self._results[name]


@pytest.fixture(scope="module")
def zoo(demo_lm: Path, tmp_path_factory: pytest.TempPathFactory) -> Zoo:
    return Zoo(demo_lm, tmp_path_factory.mktemp("batch-invariance"))


def _kinds(result: Any) -> list[str]:
    return result.finding_kinds()


@pytest.mark.parametrize("entry", [e for e in ZOO if e.kind], ids=lambda e: e.name)
def test_fault_named_and_twin_passes(zoo: Zoo, entry: Entry) -> None:
    result = zoo.evaluate(entry.name)
    assert result.status == "fail", result.message
    assert entry.kind in _kinds(result), (_kinds(result), result.message)
    assert set(_kinds(result)) <= set(KINDS)
    twin = zoo.evaluate(entry.twin or "clean")
    assert twin.status == "pass", twin.message


@pytest.mark.parametrize("entry", [e for e in ZOO if not e.kind], ids=lambda e: e.name)
def test_clean_passes(zoo: Zoo, entry: Entry) -> None:
    result = zoo.evaluate(entry.name)
    assert result.status == "pass", result.message
    assert result.metrics["logprob_max_abs_diff"] <= result.thresholds["logprob_max_abs_diff"]


def test_bf16_noise_measured_and_named(zoo: Zoo) -> None:
    """Batch-dependent bf16 rounding is measured, reported as noise with its size."""
    result = zoo.evaluate("bf16_noise")
    diff = result.metrics["logprob_max_abs_diff"]
    assert 0 < diff <= 0.5, diff
    assert result.metrics["bitwise_identical"] is False
    notes = " ".join(result.details.get("notes", [])) + result.message
    assert "noise" in notes, notes


def test_rotary_layout_noted(zoo: Zoo) -> None:
    result = zoo.evaluate("rotary_positions_not_from_mask")
    text = " ".join(result.details.get("notes", [])) + result.message
    assert "position ids not from mask" in text, text




def test_served_right_padding_is_explained_by_the_tokenizer(zoo: Zoo) -> None:
    """The served tokenizer pads on the right: tokenizer_parity is the root cause and
    batch_invariance's right_padding finding is its consequence."""
    from paritygate.rootcause import explain

    tokenizer = zoo.gate("right_padding").evaluate("tokenizer_parity", golden=False)
    explained, root = explain([tokenizer, zoo.evaluate("right_padding")])
    assert root is not None and root.check == "tokenizer_parity", root
    assert "batch_invariance" in root.explains
    assert {r.id: r.consequence_of for r in explained}["batch_invariance"] == "tokenizer_parity"


def test_batch_layout_explains_engine_consequences(zoo: Zoo) -> None:
    """A layout finding of batch_invariance is the root of the engine checks that fail with it."""
    from paritygate.result import CheckResult, Reason
    from paritygate.rootcause import explain

    layout = zoo.evaluate("position_ids_not_from_mask")
    greedy = CheckResult("generation_parity", "fail", "greedy decoding diverges", {}, None, {},
                         reasons=[Reason("finding", "diverges", finding="greedy_divergence")])
    explained, root = explain([layout, greedy])
    assert root is not None and (root.check, root.kind) == ("batch_invariance", "batch_layout")
    assert {r.id: r.consequence_of for r in explained}["generation_parity"] == "batch_invariance"


def test_layout_reads_each_fault() -> None:
    """The layout of a collated batch names what each serving loop does."""
    import lm_zoo_serving as serving

    from paritygate.engines.batching import collate_padded, layout

    rows = [[5, 6, 7], [8]]
    good = layout(rows, collate_padded(rows, 0, "left"))
    assert good.starts == [0, 2] and good.mask_passed and good.positions_from_mask
    assert not good.right_padded
    assert layout(rows, serving.right_padded(rows, 0, "left")).right_padded
    assert not layout(rows, serving.positions_not_from_mask(rows, 0, "left")).positions_from_mask
    assert not layout(rows, serving.mask_not_passed(rows, 0, "left")).mask_passed
