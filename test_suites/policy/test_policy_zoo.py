"""The policy fault zoo: the clean demo passes all seven checks; each fault fails its check.

For every fault the failing check's message must name the cause, and the set of
other checks that fail must equal the registry's ``also_fails`` (so the record in
``policy_zoo.py`` and ``ZOO.md`` stays measured, not guessed).
"""

from __future__ import annotations

import re
from pathlib import Path

import policy_zoo_builders as zb
import pytest
from policy_zoo import (
    CONTINUOUS_BASES,
    FAULTS,
    FAULTS_BY_ID,
    POLICY_CHECKS,
    ROLLOUT_CHECKS,
    SHAPE_FAULTS,
    evaluate_all,
    failing,
    fault_config,
)

ZOO_MD = Path(__file__).with_name("ZOO.md")


def _params() -> list[object]:
    # xdist_group keeps both tests of a fault on one worker under ``--dist loadgroup``.
    return [pytest.param(f, id=f.id, marks=pytest.mark.xdist_group(f.id)) for f in FAULTS]


def test_registry_is_well_formed() -> None:
    from paritygate.checks import checks_for

    policy_ids = {c.id for c in checks_for("policy")}
    assert set(POLICY_CHECKS) <= set(ROLLOUT_CHECKS) <= policy_ids
    assert len(FAULTS) >= 15
    assert len(FAULTS_BY_ID) == len(FAULTS), "fault ids must be unique"
    for check in ROLLOUT_CHECKS:
        assert any(f.check == check for f in FAULTS), f"no fault for {check}"
    for fault in FAULTS:
        assert fault.check in fault.checks
        assert fault.causes and all(fault.causes)
        assert fault.check not in fault.also_fails
        assert set(fault.also_fails) <= set(fault.checks)
        assert all(why.strip() for why in fault.also_fails.values())
        assert set(fault.linked) <= set(fault.also_fails), fault.id


def test_clean_demo_passes_every_check(zoo) -> None:
    results = zoo.results("clean")
    assert {cid: r.status for cid, r in results.items()} == dict.fromkeys(POLICY_CHECKS, "pass"), {
        cid: r.message for cid, r in results.items() if r.status != "pass"}


def test_clean_twin_of_second_output_differs_passes_every_check(zoo) -> None:
    """The demo serving (logits, probs), exported from its own inference model: its second
    declared output is compared and agrees."""
    out = zoo.root / "second_output_clean"
    config = fault_config(zoo.clean, out, zb.probs_variant(zoo.clean, out))
    results = evaluate_all(config)
    assert {cid: r.status for cid, r in results.items()} == dict.fromkeys(POLICY_CHECKS, "pass"), {
        cid: r.message for cid, r in results.items() if r.status != "pass"}
    integrity = results["export_integrity"].metrics
    assert integrity["declared_outputs_differ"] == 0
    assert integrity["declared_output_diff_ratio"] < 1.0


@pytest.mark.xdist_group("cartpole")
def test_clean_cartpole_passes_every_check(zoo) -> None:
    """The twin of the rollout faults: the PPO CartPole policy, its own export, passes all
    the policy checks and rollout_parity."""
    results = zoo.results("cartpole")
    expected = dict.fromkeys(ROLLOUT_CHECKS, "pass")
    assert {cid: r.status for cid, r in results.items()} == expected, {
        cid: r.message for cid, r in results.items() if r.status != "pass"}
    assert results["rollout_parity"].metrics["episodes"] == 4


@pytest.mark.parametrize("base", sorted(CONTINUOUS_BASES))
def test_clean_continuous_policy_passes_every_check(zoo, base) -> None:
    """The clean twin of the continuous faults: every check passes (no preprocessing is
    configured, so preprocessing_parity has nothing to compare and skips)."""
    results = zoo.results(base)
    expected = {**dict.fromkeys(POLICY_CHECKS, "pass"), "preprocessing_parity": "skip"}
    assert {cid: r.status for cid, r in results.items()} == expected, {
        cid: r.message for cid, r in results.items() if r.status != "pass"}
    logits = results["logits_agreement"].metrics
    assert logits["action_max_abs_diff"] < 1e-5 and logits["std_max_abs_diff"] < 1e-5
    if base == "cleanrl":  # a training checkpoint: the state dict under a nested key, noted
        load = results["weights_load"].details
        assert load["state_dict_key"] == "agent.actor_critic"
        assert any("read from its key 'agent.actor_critic' (set by policy.state_dict_key)" in n
                   for n in load["notes"]), load["notes"]
        assert logits["gaussian_kl_max"] < 1e-9 and logits["logprob_delta_max_abs"] < 1e-5


def test_declared_fp16_gaussian_artifact_passes(zoo, tmp_path) -> None:
    """The twin of ``cleanrl_fp16_undeclared``: the same float16 artifact, declared, passes;
    the Gaussian limits take the fp16/fp32 tier, each named in the note."""
    from policy_zoo import evaluate_all, fault_config
    from policy_zoo_builders import cleanrl_fp16

    clean = zoo.clean_for("cleanrl")
    results = evaluate_all(fault_config(clean, tmp_path, cleanrl_fp16("float16")(clean, tmp_path),
                                        "cleanrl"))
    expected = {**dict.fromkeys(POLICY_CHECKS, "pass"), "preprocessing_parity": "skip"}
    assert {cid: r.status for cid, r in results.items()} == expected, {
        cid: r.message for cid, r in results.items() if r.status != "pass"}
    logits = results["logits_agreement"]
    assert logits.metrics["action_max_abs_diff"] > 2e-5  # over the float32 limit
    note = " ".join(logits.details["notes"])
    for name in ("action_max_abs_diff 0.0442", "std_max_abs_diff 0.0442",
                 "gaussian_kl_max 7.81e-05", "logprob_delta_max_abs 0.0442"):
        assert name in note, note


@pytest.mark.parametrize("fault", _params())
def test_fault_fails_with_its_cause(zoo, fault) -> None:
    result = zoo.results(fault.id)[fault.check]
    assert result.status == "fail", f"{fault.check} {result.status} on {fault.id}: {result.message}"
    for cause in fault.causes:
        assert cause in result.message, f"{cause!r} not in: {result.message}"
    for wrong in fault.absent:
        assert wrong not in result.message, f"{wrong!r} (a wrong cause) in: {result.message}"
    if fault.kind is not None:
        assert fault.kind in result.finding_kinds(), result.finding_kinds()


@pytest.mark.parametrize("fault", _params())
def test_also_fails_is_measured(zoo, fault) -> None:
    results = zoo.results(fault.id)
    crashed = {cid: r.message for cid, r in results.items() if r.status == "error"}
    assert not crashed, f"checks crashed instead of failing by a named cause: {crashed}"
    others = failing(results) - {fault.check}
    messages = {cid: results[cid].message[:200] for cid in others ^ set(fault.also_fails)}
    assert others == set(fault.also_fails), f"registry out of date for {fault.id}: {messages}"


def _zoo_md_rows() -> dict[str, tuple[str, set[str]]]:
    row = re.compile(r"^\| `(?P<id>[^`]+)` \| `(?P<check>[^`]+)` \| .* \| (?P<also>[^|]*) \|$")
    rows = {}
    for line in ZOO_MD.read_text(encoding="utf-8").splitlines():
        m = row.match(line)
        if m:
            rows[m["id"]] = (m["check"], set(re.findall(r"`([a-z_]+)`:", m["also"])))
    return rows


def test_zoo_md_matches_registry() -> None:
    rows = _zoo_md_rows()
    expected = {f.id: (f.check, set(f.also_fails)) for f in (*FAULTS, *SHAPE_FAULTS)}
    assert rows == expected, "ZOO.md is out of date: regenerate with python " \
        "test_suites/policy/policy_zoo.py (and --shapes for the Dict and recurrent tables)"
