"""Fault zoo of ``reference_parity``: the KL reference of the demo LM's RL loop.

The demo LM is the policy under test. Its *initial policy* is the demo with every matrix moved
(a fixed seed), as an SFT model is before RL; the clean KL reference is a byte copy of that
initial policy. Each fault swaps one piece: the reference (the policy itself, another step, a
bf16 copy), the trainer's KL estimator or its reference log-prob function. Each must fail by
its named kind, each clean twin must pass; a reference that changed between two gated
checkpoints fails against its golden baseline with root cause ``reference_drift``.
"""

from __future__ import annotations

import json
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
from paritygate.provenance import sha256_file
from paritygate.rootcause import explain


def _copy(src: Path, dst: Path, edit: Callable[[dict[str, Any]], None] | None = None) -> Path:
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    if edit is not None:
        state = load_file(str(dst / "model.safetensors"))
        edit(state)
        save_file(state, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def _moved(seed: int, scale: float) -> Callable[[dict[str, Any]], None]:
    """Every matrix moved by ``scale`` of its spread: another point of training."""

    def edit(state: dict[str, Any]) -> None:
        import torch

        gen = torch.Generator().manual_seed(seed)
        for name, tensor in state.items():
            if tensor.dim() == 2:
                noise = torch.randn(tensor.shape, generator=gen) * tensor.std() * scale
                state[name] = (tensor + noise).contiguous()

    return edit


def _bf16(state: dict[str, Any]) -> None:
    import torch

    for name, tensor in state.items():
        if tensor.is_floating_point():
            state[name] = tensor.to(torch.bfloat16).contiguous()


def _without_value_head(state: dict[str, Any]) -> None:
    for name in [k for k in state if k.startswith("v_head.")]:
        del state[name]


@dataclass
class Models:
    policy: Path
    initial: Path
    reference: Path
    other_step: Path
    bf16: Path
    policy_copy: Path


@pytest.fixture(scope="session")
def kl_models(demo_lm: Path, tmp_path_factory: pytest.TempPathFactory) -> Models:
    root = tmp_path_factory.mktemp("kl-models")
    initial = _copy(demo_lm, root / "initial", _moved(10, 0.3))
    return Models(
        policy=demo_lm,
        initial=initial,
        reference=_copy(initial, root / "reference"),
        other_step=_copy(initial, root / "other-step", _moved(11, 0.05)),
        bf16=_copy(initial, root / "reference-bf16", _bf16),
        # the policy re-saved without its value head: other files, the same model
        policy_copy=_copy(demo_lm, root / "policy-copy", _without_value_head),
    )


Patch = Callable[[dict[str, Any], Models], None]


MODEL_FIELDS = ("policy", "initial", "reference", "other_step", "bf16", "policy_copy")


def _reference(**values: Any) -> Patch:
    """Set keys of the reference block; a value naming a :class:`Models` field is its path."""

    def patch(block: dict[str, Any], models: Models) -> None:
        for key, value in values.items():
            block[key] = str(getattr(models, value)) if value in MODEL_FIELDS else value

    return patch


@dataclass(frozen=True)
class Case:
    name: str
    patch: Patch
    kind: str | None
    """The finding kind the check must record (``None``: a clean twin that must pass)."""
    cause: str = ""


def _initial_sha(block: dict[str, Any], models: Models) -> None:
    block["initial"] = sha256_file(models.initial / "model.safetensors")


def _initial_digest(block: dict[str, Any], models: Models) -> None:
    from paritygate.families.causal_lm.reference import digest_dir

    block["initial"] = "sha256:" + digest_dir(models.initial)


def _other_step_against_sha(block: dict[str, Any], models: Models) -> None:
    _reference(model_dir="other_step")(block, models)
    _initial_sha(block, models)


def _declared_bf16_against_sha(block: dict[str, Any], models: Models, out: Path) -> None:
    _initial_sha(block, models)
    block["dtype"] = "bfloat16"


FAULTS: tuple[Case, ...] = (
    Case("reference_is_policy", _reference(model_dir="policy_copy"), "reference_is_policy",
         "KL(policy || reference) is exactly 0"),
    Case("reference_other_step", _reference(model_dir="other_step"), "reference_not_initial",
         "the reference is not the initial policy"),
    Case("kl_sign_flipped", _reference(kl_estimator="trainer_kl:kl_sign_flipped"),
         "kl_sign_flipped", "its sign is flipped"),
    Case("k3_swapped", _reference(kl_estimator="trainer_kl:k3_swapped"),
         "kl_arguments_swapped", "k3 with its arguments swapped"),
    Case("k3_wrong_form", _reference(kl_estimator="trainer_kl:k3_no_minus_one"),
         "kl_estimator_wrong", "none of k1, k2, k3"),
    Case("seq_kl_mask_ignored", _reference(kl_estimator="trainer_kl:seq_k3_mask_ignored"),
         "kl_mask_ignored", "ignores the mask: its per-sequence mean counts the"),
    Case("seq_kl_mean_over_pads", _reference(kl_estimator="trainer_kl:seq_k3_mean_over_pads"),
         "kl_mean_over_pads", "divides its masked sum by every position, pads included"),
    Case("seq_kl_sum_declared_mean", _reference(kl_estimator="trainer_kl:seq_k3_sum"),
         "kl_reduction_differs", "returns the masked sum per sequence"),
    Case("seq_kl_mean_declared_sum", _reference(kl_estimator="trainer_kl:trl_seq_k3",
                                                kl_reduction="sum"),
         "kl_reduction_differs", "returns the masked mean per sequence"),
    Case("reference_bf16_undeclared", _reference(model_dir="bf16"),
         "reference_precision_undeclared", "in bfloat16"),
    Case("reference_logprobs_no_mask", _reference(logprob_fn="trainer_kl:ref_logprobs_no_mask"),
         "reference_mask_ignored", "without the attention mask"),
    Case("initial_sha_other_step", _other_step_against_sha, "reference_not_initial",
         "is not the initial policy's recorded"),
)

CLEAN: tuple[Case, ...] = (
    Case("clean_k3", _reference(), None),
    Case("trl_grpo_kl", _reference(kl_estimator="trainer_kl:trl_grpo_kl"), None),
    Case("k1_callable", _reference(kl_estimator="trainer_kl:k1_plain"), None),
    Case("trl_seq_k3_mean", _reference(kl_estimator="trainer_kl:trl_seq_k3"), None),
    Case("seq_k3_sum_declared", _reference(kl_estimator="trainer_kl:seq_k3_sum",
                                           kl_reduction="sum"), None),
    Case("k2_named", _reference(kl_estimator="k2"), None),
    Case("k1_named", _reference(kl_estimator="k1"), None),
    Case("trl_grpo_ref_logprobs", _reference(logprob_fn="trainer_logprobs:trl_grpo"), None),
    Case("initial_as_sha256sum", _initial_sha, None),
    Case("initial_as_tensor_digest", _initial_digest, None),
    Case("reference_bf16_declared", _reference(model_dir="bf16", dtype="bfloat16"), None),
    Case("reference_bf16_declared_trl", _reference(model_dir="bf16", dtype="bfloat16",
                                                   logprob_fn="trainer_logprobs:trl_grpo"), None),
)


def _config(models: Models, out: Path, patch: Patch, name: str) -> Any:
    data = clean_config(models.policy)
    data["name"] = name
    data["checks"] = ["reference_parity"]
    data["golden"] = {"dir": str(out / "golden")}
    block = {"model_dir": str(models.reference), "initial": str(models.initial)}
    patch(block, models)
    data["causal_lm"]["reference"] = block
    out.mkdir(parents=True, exist_ok=True)
    return config_from_dict(data, out / "gate.yaml")


@pytest.mark.parametrize("case", FAULTS, ids=lambda c: c.name)
def test_reference_fault_named(kl_models: Models, tmp_path: Path, case: Case) -> None:
    result = Gate(_config(kl_models, tmp_path, case.patch, "kl")).evaluate(
        "reference_parity", golden=False)
    assert result.status == "fail", result.message
    assert case.kind in result.finding_kinds(), (result.finding_kinds(), result.message)
    assert case.cause in result.message, result.message


@pytest.mark.parametrize("case", CLEAN, ids=lambda c: c.name)
def test_reference_clean_twin_passes(kl_models: Models, tmp_path: Path, case: Case) -> None:
    result = Gate(_config(kl_models, tmp_path, case.patch, "kl")).evaluate(
        "reference_parity", golden=False)
    assert result.status == "pass", result.message
    assert result.metrics["kl_exact_mean"] > 0.01  # the reference really is another model
    assert result.metrics["tokens"] > 50


def test_a_per_sequence_masked_mean_is_judged_as_written(kl_models: Models,
                                                        tmp_path: Path) -> None:
    """A TRL/verl-style estimator (k3, masked mean per sequence): its per-token form is k3,
    its reduction the masked mean; the same k3 with the mask ignored is off by the pads."""
    clean = Gate(_config(kl_models, tmp_path / "ok", _reference(
        kl_estimator="trainer_kl:trl_seq_k3"), "kl")).evaluate("reference_parity", golden=False)
    assert clean.status == "pass", clean.message
    assert (clean.details["kl_form"], clean.details["kl_output"],
            clean.details["kl_reduction"]) == ("k3", "sequence", "mean")
    assert clean.metrics["kl_reduction_max_abs"] < 1e-9
    faulty = Gate(_config(kl_models, tmp_path / "bad", _reference(
        kl_estimator="trainer_kl:seq_k3_mask_ignored"), "kl")).evaluate("reference_parity",
                                                                       golden=False)
    assert faulty.finding_kinds() == ["kl_mask_ignored"], faulty.message
    assert faulty.details["kl_reduction"] == "pads_counted_mean"
    assert faulty.metrics["kl_estimate_mean"] != pytest.approx(clean.metrics["kl_estimate_mean"])


def test_trl_grpo_kl_is_recognised_as_k3(kl_models: Models, tmp_path: Path) -> None:
    case = next(c for c in CLEAN if c.name == "trl_grpo_kl")
    result = Gate(_config(kl_models, tmp_path, case.patch, "kl")).evaluate(
        "reference_parity", golden=False)
    assert result.details["kl_form"] == "k3"
    assert result.metrics["kl_estimator_max_abs"] < 1e-5


def test_reference_drift_between_checkpoints(kl_models: Models, tmp_path: Path) -> None:
    """Bless with the reference of one checkpoint; the next checkpoint's run finds another
    reference (it kept training and was saved over itself: ``initial`` is that directory too)."""
    first = _config(kl_models, tmp_path / "a", _reference(initial="reference"), "kl-run")
    blessing = Gate(first, update_golden=True)
    blessing.begin_bless()
    assert blessing.evaluate("reference_parity").status == "pass"
    blessing.commit_golden()
    assert Gate(first).evaluate("reference_parity").status == "pass"  # unchanged: passes

    moved = _reference(model_dir="other_step", initial="other_step")
    second = _config(kl_models, tmp_path / "a", moved, "kl-run")
    result = Gate(second).evaluate("reference_parity")
    assert result.status == "fail", result.message
    assert "reference_digest" in result.failed_metrics
    assert not result.finding_kinds()  # nothing wrong within this run alone
    _, root = explain([result])
    assert root is not None and root.kind == "reference_drift"


def test_root_cause_kinds(kl_models: Models, tmp_path: Path) -> None:
    expected = {"reference_is_policy": "reference_is_policy",
                "reference_other_step": "reference_provenance",
                "k3_swapped": "kl_estimator",
                "seq_kl_mask_ignored": "kl_reduction",
                "seq_kl_mean_over_pads": "kl_reduction",
                "seq_kl_sum_declared_mean": "kl_reduction",
                "reference_logprobs_no_mask": "reference_logprobs"}
    for name, kind in expected.items():
        case = next(c for c in FAULTS if c.name == name)
        result = Gate(_config(kl_models, tmp_path / name, case.patch, "kl")).evaluate(
            "reference_parity", golden=False)
        _, root = explain([result])
        assert root is not None and root.kind == kind, (name, root)


def test_cli_exits_2_with_one_line_on_a_bad_reference(kl_models: Models, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    import yaml

    config = _config(kl_models, tmp_path, _reference(kl_estimator="trainer_kl:kl_two_args"), "kl")
    path = tmp_path / "bad.yaml"
    data = config.model_dump(exclude_none=True)
    data["python_path"] = [str(Path(__file__).parent)]
    path.write_text(yaml.safe_dump(data))
    env = {k: v for k, v in os.environ.items() if k not in ("PARITYGATE_CONFIG", "CI")}
    proc = subprocess.run([sys.executable, "-m", "paritygate", "run", str(path)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "causal_lm.reference.kl_estimator" in lines[0]
    assert "reference_parity" not in proc.stdout  # stopped before any check ran


def test_skipped_without_a_reference_block(demo_lm: Path, tmp_path: Path) -> None:
    data = clean_config(demo_lm)
    data["name"] = "kl"
    data["checks"] = ["reference_parity"]
    result = Gate(config_from_dict(data, tmp_path / "gate.yaml")).evaluate(
        "reference_parity", golden=False)
    assert result.status == "skip"
    assert "causal_lm.reference" in result.message


def _edit_config_json(directory: Path, **changes: Any) -> None:
    path = directory / "config.json"
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def _bad_architecture(block: dict[str, Any], models: Models, out: Path) -> None:
    bad = _copy(models.reference, out / "deeper")
    _edit_config_json(bad, num_hidden_layers=3)
    block["model_dir"] = str(bad)


def _bad_vocab(block: dict[str, Any], models: Models, out: Path) -> None:
    bad = _copy(models.reference, out / "vocab")
    _edit_config_json(bad, vocab_size=1024)
    block["initial"] = str(bad)


def _bad_tokenizer(block: dict[str, Any], models: Models, out: Path) -> None:
    bad = _copy(models.reference, out / "tokenizer")
    path = bad / "tokenizer_config.json"
    data = json.loads(path.read_text())
    data["pad_token"] = "<unk>"
    path.write_text(json.dumps(data))
    block["model_dir"] = str(bad)


@pytest.mark.parametrize(
    ("edit", "key", "words"),
    [
        (_bad_architecture, "causal_lm.reference.model_dir", "num_hidden_layers 3"),
        (_bad_vocab, "causal_lm.reference.initial: vocab_size", "1024 but the checkpoint's"),
        (_bad_tokenizer, "causal_lm.reference.model_dir", "pad_token_id"),
        (lambda b, m, o: b.update(initial="not-a-dir-or-sha"), "causal_lm.reference.initial",
         "neither a model directory nor a sha256"),
        (lambda b, m, o: b.update(kl_estimator="k4"), "causal_lm.reference.kl_estimator",
         "expected k1, k2, k3"),
        (lambda b, m, o: b.update(kl_estimator="trainer_kl:kl_two_args"),
         "causal_lm.reference.kl_estimator", "expected (logp, logp_ref, mask)"),
        (lambda b, m, o: b.update(kl_estimator="trainer_kl:kl_mean"),
         "causal_lm.reference.kl_estimator",
         "returns () for (2, 5) log-probs and mask; expected (2, 5)"),
        (lambda b, m, o: b.update(logprob_fn="trainer_kl:nope"),
         "causal_lm.reference.logprob_fn", "has no attribute"),
        (_declared_bf16_against_sha, "causal_lm.reference.initial",
         "a sha256 proves a full-precision copy only"),
    ],
)
def test_bad_reference_input_names_the_key(
    kl_models: Models, tmp_path: Path, edit: Any, key: str, words: str
) -> None:
    config = _config(kl_models, tmp_path, lambda b, m: edit(b, m, tmp_path), "kl")
    with pytest.raises(InputError) as err:
        Gate(config).context  # noqa: B018 - built before any check runs
    assert err.value.key == key, err.value.line()
    assert words in err.value.line()
    assert "\n" not in err.value.line()


def test_report_names_the_form_and_the_tensors(kl_models: Models, tmp_path: Path) -> None:
    from paritygate.report import write_reports

    case = next(c for c in FAULTS if c.name == "reference_other_step")
    gate = Gate(_config(kl_models, tmp_path, case.patch, "kl"))
    write_reports(gate, [gate.evaluate("reference_parity", golden=False)], tmp_path / "report")
    md = (tmp_path / "report" / "report.md").read_text(encoding="utf-8")
    assert "| recognised form | k3 |" in md
    assert "differs from initial: " in md


@pytest.mark.parametrize("name", ["reference_is_policy", "reference_other_step"])
def test_root_cause_is_the_same_with_and_without_a_baseline(
    kl_models: Models, tmp_path: Path, name: str
) -> None:
    """A finding names the fault whether or not a baseline exists: blessed on the clean
    reference, the faulty run's root keeps its kind, finding and fix (never reference_drift),
    and its fix is the fault's, never the bless hint."""
    clean = _config(kl_models, tmp_path, _reference(), "kl-stable")
    blessing = Gate(clean, update_golden=True)
    blessing.begin_bless()
    assert blessing.evaluate("reference_parity").status == "pass"
    blessing.commit_golden()
    case = next(c for c in FAULTS if c.name == name)
    faulty = _config(kl_models, tmp_path, case.patch, "kl-stable")
    with_golden = Gate(faulty).evaluate("reference_parity")
    assert "reference_digest" in with_golden.failed_metrics  # the baseline sees it moved too
    without = Gate(_config(kl_models, tmp_path / "none", case.patch, "kl-stable")).evaluate(
        "reference_parity")
    assert [r.kind for r in without.reasons][-1] == "no_golden"
    assert without.bless_hint is not None and with_golden.bless_hint is None
    roots = [explain([r])[1] for r in (with_golden, without)]
    assert all(root is not None for root in roots)
    assert len({(root.kind, root.finding, root.fix) for root in roots if root}) == 1, roots
    root = roots[0]
    assert root is not None and root.kind != "reference_drift"
    assert root.fix is not None and "bless" not in root.fix
