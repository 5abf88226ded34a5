"""Fault zoo of ``reward_parity``: a reward model trained here by TRL's real ``RewardTrainer``.

The reward model is a tiny Llama sequence classifier (one label) on the demo LM's tokenizer,
trained for 30 seeded CPU steps on pairs of corpus sentences (chosen) and their shuffled words
(rejected); TRL appends EOS, pads on the right and sets ``config.pad_token_id`` to the
tokenizer's pad, and its ``checkpoint-10`` folder is the same run's earlier checkpoint. The
scored samples are 24 held-out corpus sentences split into prompt and completion (a rollout
dump's ``{"prompt", "completion"}`` lines). Each fault must fail by its named kind, each clean
twin must pass.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from lm_zoo import clean_config

from paritygate.errors import InputError
from paritygate.gate import Gate
from paritygate.load import config_from_dict

pytest.importorskip("trl")

CORPUS = Path(__file__).resolve().parents[2] / "src/paritygate/demo/data/corpus.txt"
TRAIN_STEPS = 30


def _train(out: Path, tokenizer_dir: Path) -> None:
    """TRL RewardTrainer on the preference pairs; the final model in ``out/model`` and the
    run's ``checkpoint-10`` kept as another checkpoint."""
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification
    from trl import RewardConfig, RewardTrainer

    torch.manual_seed(0)
    rng = random.Random(0)
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    lines = [ln.strip() for ln in CORPUS.read_text(encoding="utf-8").splitlines() if ln.strip()]
    rows = []
    for line in lines[:200]:
        words = line.split()
        rng.shuffle(words)
        rows.append({"chosen": line, "rejected": " ".join(words)})
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
        num_labels=1, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id)
    args = RewardConfig(
        output_dir=str(out / "run"), per_device_train_batch_size=16, max_steps=TRAIN_STEPS,
        learning_rate=3e-3, logging_steps=10, report_to=[], save_strategy="steps",
        save_steps=10, save_total_limit=None, seed=0, use_cpu=True, dataloader_num_workers=0,
        disable_tqdm=True)
    trainer = RewardTrainer(model=LlamaForSequenceClassification(config), args=args,
                            train_dataset=Dataset.from_list(rows), processing_class=tok)
    trainer.train()
    trainer.save_model(str(out / "model"))
    tok.save_pretrained(str(out / "model"))
    samples = out / "completions.jsonl"
    with samples.open("w", encoding="utf-8") as fh:
        for i, line in enumerate(lines[300:324]):
            words = line.split(" ")
            half = len(words) // 2
            fh.write(json.dumps({"id": i, "prompt": " ".join(words[:half]),
                                 "completion": " " + " ".join(words[half:])}) + "\n")


@dataclass
class Rewards:
    policy: Path
    """The demo LM: the policy whose gate config carries the reward block."""
    model: Path
    checkpoint: Path
    completions: Path
    root: Path

    def variant(self, name: str, config: Callable[[dict[str, Any]], None] | None = None,
                cast: str | None = None, tokenizer: dict[str, Any] | None = None) -> Path:
        """A copy of the trained model with its config.json, dtype or tokenizer edited."""
        out = self.root / name
        if out.exists():
            return out
        shutil.copytree(self.model, out, ignore=shutil.ignore_patterns("*.bin"))
        if config is not None:
            data = json.loads((out / "config.json").read_text())
            config(data)
            (out / "config.json").write_text(json.dumps(data))
        if tokenizer is not None:
            path = out / "tokenizer_config.json"
            data = json.loads(path.read_text())
            data.update(tokenizer)
            path.write_text(json.dumps(data))
        if cast is not None:
            import torch
            from safetensors.torch import load_file, save_file

            state = load_file(str(out / "model.safetensors"))
            state = {k: v.to(getattr(torch, cast)).contiguous() for k, v in state.items()}
            save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
        return out


@pytest.fixture(scope="session")
def rewards(demo_lm: Path, tmp_path_factory: pytest.TempPathFactory) -> Rewards:
    root = tmp_path_factory.mktemp("reward-models")
    _train(root, demo_lm)
    return Rewards(demo_lm, root / "model", root / "run" / "checkpoint-10",
                   root / "completions.jsonl", root)


Patch = Callable[[dict[str, Any], Rewards], None]


@dataclass(frozen=True)
class Case:
    name: str
    patch: Patch
    kinds: tuple[str, ...] = ()
    """Finding kinds the check must record (empty: a clean twin that must pass)."""
    cause: str = ""


def _set(**values: Any) -> Patch:
    def patch(block: dict[str, Any], r: Rewards) -> None:
        block.update(values)

    return patch


def _unknown_pad(block: dict[str, Any], r: Rewards) -> None:
    """config.json's pad_token_id is <unk> (3), not the tokenizer's <pad> (0): harmless while
    the scorer left-pads, as training did; a right-padded row is read at its last pad."""
    block["model_dir"] = str(r.variant("unk-pad", lambda c: c.update(pad_token_id=3)))
    block["training"] = {"padding_side": "left"}
    block["serving"] = {"padding_side": "right"}


def _no_pad(block: dict[str, Any], r: Rewards) -> None:
    block["model_dir"] = str(r.variant("no-pad", lambda c: c.pop("pad_token_id")))


def _bf16(declared: bool) -> Patch:
    def patch(block: dict[str, Any], r: Rewards) -> None:
        block["model_dir"] = str(r.variant("bf16", cast="bfloat16"))
        block["trained_dir"] = str(r.model)
        if declared:
            block["dtype"] = "bfloat16"

    return patch


def _stale(block: dict[str, Any], r: Rewards) -> None:
    block["model_dir"] = str(r.checkpoint)
    block["trained_dir"] = str(r.model)


def _pad_is_eos(block: dict[str, Any], r: Rewards) -> None:
    """TRL's choice for a tokenizer without a pad: pad = EOS in the tokenizer and the config;
    both sides read the token before the EOS, consistently."""
    block["model_dir"] = str(r.variant("pad-eos", lambda c: c.update(pad_token_id=2),
                                       tokenizer={"pad_token": "</s>"}))


def _function(name: str, slope_max: float | None = None, with_model: bool = False,
              matches: bool | None = None) -> Patch:
    def patch(block: dict[str, Any], r: Rewards) -> None:
        import trainer_rewards

        trainer_rewards.MODEL_DIR = str(r.model)
        if not with_model:
            block.pop("model_dir")
        block["function"] = f"trainer_rewards:{name}"
        if matches is not None:
            block["function_matches_model"] = matches
        if slope_max is not None:
            block["length_slope_max"] = slope_max

    return patch


def _encoder(r: Rewards) -> Path:
    """A DistilBERT classifier (one label, pooled head: no per-position scores to observe)."""
    out = r.root / "encoder"
    if not out.exists():
        import torch
        from transformers import (
            AutoTokenizer,
            DistilBertConfig,
            DistilBertForSequenceClassification,
        )

        torch.manual_seed(0)
        tok = AutoTokenizer.from_pretrained(r.model)
        config = DistilBertConfig(vocab_size=len(tok), dim=32, n_layers=1, n_heads=2,
                                  hidden_dim=64, num_labels=1, pad_token_id=tok.pad_token_id)
        DistilBertForSequenceClassification(config).eval().save_pretrained(out)
        tok.save_pretrained(out)
    return out


FAULTS: tuple[Case, ...] = (
    Case("right_padding", _unknown_pad, ("padding_side_differs", "score_read_at_pad"),
         "read at a pad token"),
    Case("pad_token_missing", _no_pad, ("pad_token_missing",), "has no pad_token_id"),
    Case("max_length_differs", _set(serving={"max_length": 14}), ("truncation_differs",),
         "samples are cut differently"),
    Case("truncation_side_differs",
         _set(training={"max_length": 14, "truncation_side": "left"},
              serving={"max_length": 14, "truncation_side": "right"}),
         ("truncation_differs",), "truncation differs"),
    Case("prompt_scored", _set(training={"scored_span": "completion"},
                               serving={"scored_span": "prompt_completion"}),
         ("scored_span_differs",), "scored_span differs"),
    Case("chat_template_one_side", _set(training={"chat_template": True}, serving={}),
         ("chat_template_differs",), "chat_template differs"),
    Case("bf16_undeclared", _bf16(False), ("reward_precision_undeclared",), "in bfloat16"),
    Case("stale_reward_model", _stale, ("stale_reward_model",), "from another checkpoint"),
    Case("token_sum_head", _function("token_sum_rm", slope_max=0.2), ("length_slope",),
         "per completion token"),
    Case("batch_normalised_function", _function("batch_dependent"), ("batch_variance",),
         "depend on the batch"),
    Case("token_mean_scorer", _function("token_mean_rm", with_model=True),
         ("function_scores_differ",), "scores the samples otherwise than the trained reward "
         "model"),
    Case("rescaled_scorer", _function("scaled_rm", with_model=True), ("function_rescaled",),
         "rescaled: 2 x score +0.5"),
    Case("format_reward_beside_model", _function("ends_with_period", with_model=True),
         ("function_scores_differ",), "function_matches_model: false"),
)

CLEAN: tuple[Case, ...] = (
    Case("trl_layout", _set(training={"padding_side": "right"})),
    Case("left_both", _set(training={"padding_side": "left"})),
    Case("right_vs_left_with_pad_id", _set(training={"padding_side": "left"},
                                           serving={"padding_side": "right"})),
    Case("same_truncation", _set(training={"max_length": 14, "truncation_side": "left"})),
    Case("chat_template_both", _set(training={"chat_template": True})),
    Case("bf16_declared", _bf16(True)),
    Case("pad_is_eos_consistent", _pad_is_eos),
    Case("format_reward_function", _function("ends_with_period")),
    Case("last_token_function", _function("last_token_rm", slope_max=0.2)),
    Case("model_and_function", _function("last_token_rm", slope_max=0.2, with_model=True)),
    Case("format_reward_declared_other", _function("ends_with_period", with_model=True,
                                                   matches=False)),
    Case("probe_samples", lambda b, r: b.pop("completions")),
    Case("encoder_classifier", lambda b, r: b.update(model_dir=str(_encoder(r)),
                                                     training={"padding_side": "right"})),
)


def _gate(r: Rewards, out: Path, patch: Patch, golden: Path | None = None,
          bless: bool = False) -> Gate:
    import trainer_rewards

    trainer_rewards.MODEL_DIR = str(r.model)
    data = clean_config(r.policy)
    data["name"] = "rw"
    data["checks"] = ["reward_parity"]
    data["python_path"] = [str(Path(__file__).parent)]
    if golden is not None:
        data["golden"] = {"dir": str(golden)}
    block: dict[str, Any] = {"model_dir": str(r.model), "completions": str(r.completions)}
    patch(block, r)
    data["causal_lm"]["reward"] = block
    out.mkdir(parents=True, exist_ok=True)
    return Gate(config_from_dict(data, out / "gate.yaml"), update_golden=bless)


@pytest.mark.parametrize("case", FAULTS, ids=lambda c: c.name)
def test_reward_fault_named(rewards: Rewards, tmp_path: Path, case: Case) -> None:
    result = _gate(rewards, tmp_path, case.patch).evaluate("reward_parity", golden=False)
    assert result.status == "fail", result.message
    assert set(case.kinds) <= set(result.finding_kinds()), (result.finding_kinds(),
                                                            result.message)
    assert case.cause in result.message, result.message


@pytest.mark.parametrize("case", CLEAN, ids=lambda c: c.name)
def test_reward_clean_twin_passes(rewards: Rewards, tmp_path: Path, case: Case) -> None:
    result = _gate(rewards, tmp_path, case.patch).evaluate("reward_parity", golden=False)
    assert result.status == "pass", result.message
    assert result.metrics["samples"] >= 5


def test_each_reward_model_is_a_record_of_its_own(rewards: Rewards, tmp_path: Path) -> None:
    """The scoring copy and the trained model are chosen when the block loads, not by a side's
    name at scoring time: one model where the scoring copy is the trained directory run in
    float32, two (each in its own dtype, named by its own key) where a dtype is declared."""
    same = _gate(rewards, tmp_path / "same", _set()).context.reward
    assert same is not None and same.scoring is not None
    assert same.trained is same.scoring and same.scoring.dtype == "float32"
    declared = _gate(rewards, tmp_path / "bf16", _bf16(True)).context.reward
    assert declared is not None and declared.scoring is not None
    assert declared.trained is not None and declared.trained is not declared.scoring
    assert (declared.scoring.dtype, declared.trained.dtype) == ("bfloat16", "float32")
    assert (declared.scoring.key, declared.trained.key) == ("causal_lm.reward.model_dir",
                                                             "causal_lm.reward.trained_dir")


def test_a_scorer_is_measured_against_the_model(rewards: Rewards, tmp_path: Path) -> None:
    """The token-mean head moves scores and flips pair rankings; the last-token scorer is
    the model's own scores (its twin)."""
    bad = _gate(rewards, tmp_path / "bad", _function("token_mean_rm", with_model=True)
                ).evaluate("reward_parity", golden=False)
    assert bad.metrics["function_score_max_abs"] > 0.05
    assert 0 < bad.metrics["function_pairs_flipped"] <= 1
    assert bad.details["function_vs_model"]["pairs_flipped"] > 0
    good = _gate(rewards, tmp_path / "ok", _function("last_token_rm", with_model=True)
                 ).evaluate("reward_parity", golden=False)
    assert good.metrics["function_score_max_abs"] < 1e-4
    assert good.metrics["function_pairs_flipped"] == 0


def test_a_scorer_that_raises_exits_2_naming_the_key(
        rewards: Rewards, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    from paritygate.cli import main

    gate = _gate(rewards, tmp_path, _function("raises", with_model=True))
    path = tmp_path / "gate.yaml"
    path.write_text(yaml.safe_dump(gate.config.model_dump(mode="json", exclude_none=True)))
    capsys.readouterr()
    assert main(["run", str(path), "--report-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "causal_lm.reward.function" in err[0], err
    assert "KeyError" in err[0] and "Traceback" not in err[0]


def test_pad_is_eos_is_noted(rewards: Rewards, tmp_path: Path) -> None:
    result = _gate(rewards, tmp_path, _pad_is_eos).evaluate("reward_parity", golden=False)
    assert any("pad_token_id == eos_token_id" in n for n in result.details["notes"])


def test_skipped_without_a_reward_block(demo_lm: Path, tmp_path: Path) -> None:
    data = clean_config(demo_lm)
    data["name"] = "rw"
    data["checks"] = ["reward_parity"]
    result = Gate(config_from_dict(data, tmp_path / "gate.yaml")).evaluate(
        "reward_parity", golden=False)
    assert result.status == "skip"
    assert "causal_lm.reward" in result.message


def _labels(n: int) -> Callable[[dict[str, Any]], None]:
    def edit(c: dict[str, Any]) -> None:
        c["id2label"] = {str(i): f"LABEL_{i}" for i in range(n)}
        c["label2id"] = {f"LABEL_{i}": i for i in range(n)}

    return edit


@pytest.mark.parametrize(
    ("edit", "key", "words"),
    [
        (lambda b, r: b.update(model_dir=str(r.policy)), "causal_lm.reward.model_dir",
         "not a sequence-classification model"),
        (lambda b, r: b.update(model_dir=str(r.variant("two-labels", _labels(2)))),
         "causal_lm.reward.model_dir", "num_labels is 2"),
        (lambda b, r: b.update(function="trainer_rewards:two_args"),
         "causal_lm.reward.function", "expected (prompts, completions"),
        (lambda b, r: b.update(trained_dir=str(r.variant(
            "deeper", lambda c: c.update(num_hidden_layers=3)))),
         "causal_lm.reward.trained_dir", "num_hidden_layers 3"),
        (lambda b, r: b.update(completions=str(_bad_completions(r))),
         "causal_lm.reward.completions: line 2", "expected"),
    ],
)
def test_bad_reward_input_names_the_key(
    rewards: Rewards, tmp_path: Path, edit: Any, key: str, words: str
) -> None:
    gate = _gate(rewards, tmp_path, edit)
    with pytest.raises(InputError) as err:
        gate.context  # noqa: B018 - built before any check runs
    assert err.value.key == key, err.value.line()
    assert words in err.value.line()


def _bad_completions(r: Rewards) -> Path:
    path = r.root / "bad.jsonl"
    path.write_text('{"prompt": "a", "completion": "b"}\n{"prompt": "a"}\n')
    return path


def test_empty_reward_block_is_a_config_error(demo_lm: Path, tmp_path: Path) -> None:
    from pydantic import ValidationError

    data = clean_config(demo_lm)
    data["name"] = "rw"
    data["causal_lm"]["reward"] = {}
    with pytest.raises((InputError, ValidationError)) as err:
        config_from_dict(data, tmp_path / "gate.yaml")
    assert "causal_lm.reward" in str(err.value)


def test_root_cause_kinds(rewards: Rewards, tmp_path: Path) -> None:
    from paritygate.rootcause import explain

    expected = {"right_padding": "reward_read_position", "prompt_scored": "reward_scoring_layout",
                "stale_reward_model": "reward_provenance", "token_sum_head": "reward_length",
                "batch_normalised_function": "reward_invariance",
                "token_mean_scorer": "reward_function_differs"}
    for name, kind in expected.items():
        case = next(c for c in FAULTS if c.name == name)
        result = _gate(rewards, tmp_path / name, case.patch).evaluate("reward_parity",
                                                                       golden=False)
        _, root = explain([result])
        assert root is not None and root.kind == kind, (name, root)


def test_report_lists_the_samples_that_moved(rewards: Rewards, tmp_path: Path) -> None:
    from paritygate.report import write_reports

    case = next(c for c in FAULTS if c.name == "right_padding")
    gate = _gate(rewards, tmp_path, case.patch)
    results = [gate.evaluate("reward_parity", golden=False)]
    write_reports(gate, results, tmp_path / "report",
        formats=frozenset({"json", "md", "html", "junit"}))
    md = (tmp_path / "report" / "report.md").read_text(encoding="utf-8")
    html = (tmp_path / "report" / "report.html").read_text(encoding="utf-8")
    assert "reward_parity: samples" in md and "| sample | training score |" in md
    assert "<h3>reward_parity: samples</h3>" in html
    assert md.count("| yes |") == min(12, results[0].metrics["read_at_pad"])  # 12 rows shown


def test_blessed_then_gated_against_golden(rewards: Rewards, tmp_path: Path) -> None:
    """Blessed once, the same reward passes against its baseline; a stale scoring copy gated
    under that baseline fails by its finding."""
    golden = tmp_path / "golden"
    blessing = _gate(rewards, tmp_path / "a", _set(), golden, bless=True)
    blessing.begin_bless()
    assert blessing.evaluate("reward_parity").status == "pass"
    blessing.commit_golden()
    assert (golden / "rw" / "reward_parity.json").is_file()
    assert _gate(rewards, tmp_path / "a", _set(), golden).evaluate("reward_parity").status == "pass"
    result = _gate(rewards, tmp_path / "b", _stale, golden).evaluate("reward_parity")
    assert result.status == "fail" and "stale_reward_model" in result.finding_kinds()


def test_samples_from_a_rollout_dump(rewards: Rewards, tmp_path: Path) -> None:
    """A rollout dump's token ids, decoded by the policy's tokenizer, are the scored samples."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(rewards.policy)
    dump = tmp_path / "rollouts.jsonl"
    rows = [json.loads(ln) for ln in rewards.completions.read_text().splitlines()]
    with dump.open("w") as fh:
        for row in rows:
            prompt = tok(row["prompt"])["input_ids"]
            completion = tok(row["completion"], add_special_tokens=False)["input_ids"]
            fh.write(json.dumps({"prompt_ids": prompt, "completion_ids": completion,
                                 "logprobs": [-0.5] * len(completion)}) + "\n")
    gate = _gate(rewards, tmp_path, _set(completions=str(dump)))
    assert gate.context.reward.samples[0].completion == rows[0]["completion"]
    result = gate.evaluate("reward_parity", golden=False)
    assert result.status == "pass" and result.metrics["samples"] == len(rows), result.message


def test_samples_generated_from_the_probes(rewards: Rewards, tmp_path: Path) -> None:
    """``completions: generated``: the probes' greedy continuations are scored."""
    gate = _gate(rewards, tmp_path, _set(completions="generated",
                                         training={"padding_side": "right"}))
    result = gate.evaluate("reward_parity", golden=False)
    assert result.status == "pass", result.message
    assert result.metrics["samples"] >= 5
    assert any("greedy continuations" in n for n in result.details["notes"])
    faulty = _gate(rewards, tmp_path / "f", _set(completions="generated",
                                                 training={"scored_span": "completion"},
                                                 serving={"scored_span": "prompt_completion"}))
    assert "scored_span_differs" in faulty.evaluate("reward_parity", golden=False).finding_kinds()
