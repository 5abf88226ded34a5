"""rollout_parity on real environments: a Stable-Baselines3 PPO trained on CartPole-v1 inside the
tests (discrete, shared with the fault zoo) and a small torch actor on Pendulum-v1 (continuous).

The clean policies pass; the zoo's faults (``policy_zoo.py``) fail with the first divergent
step named; a divergence under the near-tie margin is excused; a config without a rollout
section skips the check and verifies nothing; bad environments are bad input.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("gymnasium", reason="gymnasium not installed (extra 'rollout')")
pytest.importorskip("stable_baselines3", reason="stable-baselines3 not installed (extra 'sb3')")

import policy_zoo_builders as zb
import rollout_subjects as rs
from policy_zoo import FAULTS_BY_ID, merge

from paritygate.errors import InputError
from paritygate.gate import Gate
from paritygate.load import config_from_dict
from paritygate.report import write_reports
from paritygate.report.json_report import NOTHING_VERIFIED, overall_status

pytestmark = pytest.mark.xdist_group("cartpole")


@pytest.fixture(scope="module")
def cartpole(clean_cartpole: Any) -> Path:
    return clean_cartpole()


@pytest.fixture(scope="module")
def pendulum(build_once: Any) -> Path:
    return build_once("pendulum-actor", rs.build_pendulum)


def _gate(data: dict[str, Any], root: Path, **over: Any) -> Gate:
    root.mkdir(parents=True, exist_ok=True)
    data = merge(data, over)
    data["golden"] = {"dir": str(root / "golden")}
    return Gate(config_from_dict(data, root / "gate.yaml"))


def test_clean_ppo_cartpole_passes_and_reports_every_episode(cartpole: Path,
                                                            tmp_path: Path) -> None:
    gate = _gate(rs.cartpole_config(cartpole), tmp_path)
    result = gate.evaluate("rollout_parity", golden=False)
    assert result.status == "pass", result.message
    m = result.metrics
    assert m["episodes"] == 4 and m["action_agreement"] == 1.0
    assert m["unexcused_divergences"] == 0 and m["max_observation_abs_diff"] == 0.0
    assert m["max_return_abs_diff"] == 0.0 and m["first_divergent_step"] is None
    rows = result.details["episodes"]
    assert [r["seed"] for r in rows] == [0, 1, 2, 3]
    assert all(r["training_return"] == r["artifact_return"] > 0 for r in rows)
    assert m["steps"] == sum(r["training_length"] for r in rows) > 4 * 20  # PPO learned a bit
    written = write_reports(gate, [result], tmp_path / "report",
        formats=frozenset({"json", "md", "html", "junit"}))
    png = tmp_path / "report" / "rollout_parity.png"
    assert str(png) in written.files and png.read_bytes()[:4] == b"\x89PNG"
    md = (tmp_path / "report" / "report.md").read_text()
    assert "| episode | seed | return (training / artifact) |" in md
    assert "| 3 | 3 |" in md
    html = (tmp_path / "report" / "report.html").read_text()
    assert 'alt="per-step action difference and cumulative return"' in html


def test_same_episodes_from_seeds_list(cartpole: Path, tmp_path: Path) -> None:
    data = rs.cartpole_config(cartpole)
    data["policy"]["rollout"] = {"env": "CartPole-v1", "seeds": [7, 11]}
    gate = _gate(data, tmp_path)
    result = gate.evaluate("rollout_parity", golden=False)
    assert result.status == "pass", result.message
    assert [r["seed"] for r in result.details["episodes"]] == [7, 11]


@pytest.mark.parametrize("fault_id", ["rollout_stale_velocity_stats", "rollout_action_bias"])
def test_fault_names_the_first_divergent_step_and_its_margin(zoo: Any, fault_id: str) -> None:
    result = zoo.results(fault_id)["rollout_parity"]
    assert result.status == "fail"
    assert result.finding_kinds() and set(result.finding_kinds()) == {"action_divergence"}
    first = result.metrics["first_divergent_step"]
    rows = [r for r in result.details["episodes"] if r["verdict"] == "diverged"]
    assert rows and first == min(r["first_divergent_step"] for r in rows)
    row = rows[0]
    assert (f"episode 0 (seed 0): actions diverge at step {row['first_divergent_step']}: "
            f"training path {row['training_action']} vs artifact {row['artifact_action']} "
            f"(logit margin {row['margin']:.3g} >= near-tie tolerance 0.001)") in result.message
    assert result.metrics["unexcused_divergences"] == len(rows)
    assert result.metrics["action_agreement"] < 1.0


def test_rollout_divergence_is_a_consequence_of_the_probe_finding(zoo: Any,
                                                                 tmp_path: Path) -> None:
    fault = FAULTS_BY_ID["rollout_stale_velocity_stats"]
    results = zoo.results(fault.id)
    written = write_reports(Gate(zoo.configs[fault.id]), [results[c] for c in fault.checks],
                            tmp_path)
    data = json.loads((tmp_path / "report.json").read_text())
    assert written.root_cause == "preprocessing_parity"
    assert data["root_cause"]["kind"] == "preprocessing_mismatch"
    checks = {c["id"]: c for c in data["checks"]}
    assert checks["rollout_parity"]["consequence_of"] == "preprocessing_parity"
    assert checks["rollout_parity"]["message"].startswith("see preprocessing_parity: ")


def test_a_near_tie_divergence_is_excused(cartpole: Path, tmp_path: Path) -> None:
    """A logit shifted by 0.05 flips only actions decided by less than 0.05: under a near-tie
    margin of 0.06 every divergence is a near-tie, excused and noted (logits_agreement still
    fails: the outputs do differ)."""
    overrides = zb.cartpole_artifact(zb.action_bias(0.05))(cartpole, tmp_path / "artifact")
    strict = _gate(rs.cartpole_config(cartpole), tmp_path / "strict", **overrides)
    assert strict.evaluate("rollout_parity", golden=False).status == "fail"
    loose = merge(overrides, {"policy": {"rollout": {"near_tie_margin": 0.06}}})
    gate = _gate(rs.cartpole_config(cartpole), tmp_path / "loose", **loose)
    result = gate.evaluate("rollout_parity", golden=False)
    assert result.status == "pass", result.message
    assert result.metrics["excused_divergences"] == 4
    assert result.metrics["unexcused_divergences"] == 0
    assert all(r["verdict"] == "excused (near-tie)" and r["margin"] < 0.05
               for r in result.details["episodes"])
    notes = result.details["notes"]
    assert any("excused, near-tie (margin" in n and "< 0.06" in n for n in notes), notes
    assert gate.evaluate("logits_agreement", golden=False).status == "fail"


def test_without_a_rollout_section_the_check_skips_and_verifies_nothing(
        cartpole: Path, tmp_path: Path) -> None:
    data = rs.cartpole_config(cartpole)
    del data["policy"]["rollout"]
    data["checks"] = ["rollout_parity"]
    result = _gate(data, tmp_path).evaluate("rollout_parity")
    assert result.status == "skip"
    assert "no policy.rollout section" in result.message
    assert overall_status([result]) == NOTHING_VERIFIED


def test_nan_actions_fail_by_name(zoo: Any) -> None:
    result = zoo.results("rollout_nan_serving_input")["rollout_parity"]
    assert result.status == "fail"
    assert "nonfinite_action" in result.finding_kinds()
    assert result.metrics["nonfinite_actions"] >= 1


def test_an_environment_that_ignores_its_seed_fails_alone(zoo: Any) -> None:
    results = zoo.results("rollout_env_ignores_seed")
    result = results["rollout_parity"]
    assert result.status == "fail"
    assert "trajectory_differs" in result.finding_kinds()
    assert "action_divergence" not in result.finding_kinds()
    assert {c for c, r in results.items() if r.status == "fail"} == {"rollout_parity"}


@pytest.mark.parametrize(("over", "key", "cause"), [
    ({"env": "NoSuchEnv-v0"}, "policy.rollout.env", "cannot build the environment"),
    ({"env": "Pendulum-v1"}, "policy.rollout.env", "observes shape [3] but the probes"),
    ({"env": None, "factory": "rollout_models:pendulum_training"}, "policy.rollout.factory",
     "not an environment"),
])
def test_a_bad_environment_is_bad_input(cartpole: Path, tmp_path: Path, over: dict[str, Any],
                                        key: str, cause: str) -> None:
    gate = _gate(rs.cartpole_config(cartpole), tmp_path, policy={"rollout": over})
    with pytest.raises(InputError) as info:
        gate.evaluate("rollout_parity")
    assert info.value.key == key and cause in info.value.cause, info.value.line()


def test_seeds_and_episodes_together_are_a_config_error(cartpole: Path, tmp_path: Path) -> None:
    data = merge(rs.cartpole_config(cartpole), {"policy": {"rollout": {"seeds": [1, 2]}}})
    with pytest.raises(InputError) as info:
        config_from_dict(data, tmp_path / "gate.yaml")
    assert "policy.rollout" in (info.value.key or "") and "not both" in info.value.cause


# --- continuous actions: Pendulum-v1 -------------------------------------------------------------


def test_clean_pendulum_actor_passes(pendulum: Path, tmp_path: Path) -> None:
    gate = _gate(rs.pendulum_config(pendulum), tmp_path)
    result = gate.evaluate("rollout_parity", golden=False)
    assert result.status == "pass", result.message
    assert result.metrics["action_agreement"] == 1.0
    assert 0 < result.metrics["max_action_abs_diff"] < 1e-5  # fp32 noise, compounding
    assert result.metrics["max_observation_abs_diff"] < 1e-4
    assert all(r["training_length"] == 200 for r in result.details["episodes"])


def _scale_action_weight(factor: float) -> Any:
    def edit(model: Any) -> None:
        from onnx import numpy_helper

        for i, init in enumerate(model.graph.initializer):
            if init.name == "actor.2.weight":
                w = numpy_helper.to_array(init) * np.float32(factor)
                model.graph.initializer[i].CopyFrom(numpy_helper.from_array(w, init.name))
                return
        raise LookupError("actor.2.weight not in the Pendulum artifact")

    return edit


def test_perturbed_pendulum_artifact_diverges_with_the_action_difference(
        pendulum: Path, tmp_path: Path) -> None:
    artifact = tmp_path / "policy.onnx"
    zb.edit_onnx(pendulum, artifact, _scale_action_weight(1.01))
    gate = _gate(rs.pendulum_config(pendulum), tmp_path, policy={"artifact": str(artifact)})
    result = gate.evaluate("rollout_parity", golden=False)
    assert result.status == "fail"
    assert set(result.finding_kinds()) == {"action_divergence"}
    assert "actions diverge at step" in result.message
    assert "> action_tolerance 0.0001" in result.message
    assert "the artifact's output on the training model input differs by" in result.message


def test_continuous_actions_are_clipped_to_the_action_space(pendulum: Path,
                                                           tmp_path: Path) -> None:
    from paritygate.families.policy.rollout import action_margin, env_action

    ctx = _gate(rs.pendulum_config(pendulum), tmp_path).context
    assert env_action(ctx.rollout_env, ctx.spec, np.array([5.0], np.float32)).tolist() == [2.0]
    assert env_action(ctx.rollout_env, ctx.spec, np.array([-0.5], np.float32)).tolist() == [-0.5]
    assert action_margin(ctx.rollout_env, np.array([0.3], np.float32)) == float("inf")


def test_discrete_actions_are_the_argmax_and_the_margin_its_gap(cartpole: Path,
                                                              tmp_path: Path) -> None:
    from paritygate.families.policy.rollout import action_margin, env_action

    ctx = _gate(rs.cartpole_config(cartpole), tmp_path).context
    assert env_action(ctx.rollout_env, ctx.spec, np.array([0.2, 1.5], np.float32)) == 1
    assert action_margin(ctx.rollout_env, np.array([0.2, 1.5], np.float32)) == pytest.approx(1.3)


def test_continuous_actions_follow_the_declared_distribution(pendulum: Path,
                                                            tmp_path: Path) -> None:
    """With ``policy.distribution`` the env action is the deterministic action it defines
    (tanh-squashed and scaled here), and an artifact serving the action is taken as it is."""
    from paritygate.config.policy import DistributionSpec
    from paritygate.families.policy.rollout import env_action

    ctx = _gate(rs.pendulum_config(pendulum), tmp_path).context
    env = ctx.rollout_env  # built for the undeclared spec
    dist = DistributionSpec(squash="tanh", action_scale=2.0, serving_output="action")
    ctx.spec = ctx.spec.model_copy(update={"distribution": dist})
    mean = np.array([0.5], np.float32)
    assert env_action(env, ctx.spec, mean).tolist() == pytest.approx([2.0 * np.tanh(0.5)])
    assert env_action(env, ctx.spec, mean, served=True).tolist() == [0.5]
    assert env_action(env, ctx.spec, np.array([3.0], np.float32), served=True).tolist() == [2.0]


# --- a Dict observation and a recurrent policy, stepped closed loop ------------------------------


@pytest.fixture(scope="module")
def dict_cartpole(build_once: Any) -> Path:
    return build_once("dict-cartpole", rs.build_dict_cartpole)


@pytest.fixture(scope="module")
def recurrent_cartpole(build_once: Any) -> Path:
    from paritygate.demo import shapes

    return build_once("recurrent-cartpole", lambda out: shapes.build_recurrent(out, seed=1))


def test_dict_observation_policy_passes_clean(dict_cartpole: Path, tmp_path: Path) -> None:
    gate = _gate(rs.dict_cartpole_config(dict_cartpole), tmp_path)
    result = gate.evaluate("rollout_parity", golden=False)
    assert result.status == "pass", result.message
    assert result.metrics["action_agreement"] == 1.0 and result.metrics["episodes"] == 4
    episode = gate.context.rollouts.candidate[0]
    assert set(episode.observations) == {"pos", "vel"}
    assert episode.observations["vel"].shape == (episode.length, 2)


def test_dict_key_preprocessing_fault_diverges_naming_the_key(dict_cartpole: Path,
                                                            tmp_path: Path) -> None:
    data = rs.dict_cartpole_config(dict_cartpole)
    data["policy"]["inputs"][1]["preprocessing"]["serving"] = (
        "rollout_models:scale_vel_serving_stale")
    gate = _gate(data, tmp_path)
    result = gate.evaluate("rollout_parity", golden=False)
    assert result.status == "fail"
    assert set(result.finding_kinds()) == {"action_divergence"}
    first = result.metrics["first_divergent_step"]
    assert first is not None and f"actions diverge at step {first}" in result.message
    assert "serving preprocessing's model input 'vel' differs by" in result.message
    assert "'pos'" not in result.message


def test_a_dict_policy_in_an_environment_without_its_keys_is_bad_input(
        dict_cartpole: Path, tmp_path: Path) -> None:
    gate = _gate(rs.dict_cartpole_config(dict_cartpole), tmp_path,
                 policy={"rollout": {"factory": None, "env": "CartPole-v1"}})
    with pytest.raises(InputError) as info:
        gate.evaluate("rollout_parity")
    assert info.value.key == "policy.rollout.env"
    assert "need a Dict space with those keys" in info.value.cause, info.value.line()


def test_recurrent_policy_passes_with_its_state_fed_back(recurrent_cartpole: Path,
                                                        tmp_path: Path) -> None:
    gate = _gate(rs.recurrent_cartpole_config(recurrent_cartpole), tmp_path)
    result = gate.evaluate("rollout_parity", golden=False)
    assert result.status == "pass", result.message
    assert result.metrics["action_agreement"] == 1.0
    episode = gate.context.rollouts.reference[0]
    assert [float(s["episode_start"][0]) for s in episode.incoming_states[:2]] == [1.0, 0.0]


def test_recurrent_missing_reset_diverges_naming_the_first_step(recurrent_cartpole: Path,
                                                               tmp_path: Path) -> None:
    """The zoo's missing reset (the export ignores its episode-start input): the serving path
    runs on from the state fed in, the training path resets to its learned initial state."""
    import shape_zoo_builders as sb

    overrides = sb.recurrent_artifact(sb.no_reset)(recurrent_cartpole, tmp_path / "artifact")
    gate = _gate(rs.recurrent_cartpole_config(recurrent_cartpole), tmp_path, **overrides)
    result = gate.evaluate("rollout_parity", golden=False)
    assert result.status == "fail"
    assert set(result.finding_kinds()) == {"action_divergence"}
    first = result.metrics["first_divergent_step"]
    rows = [r for r in result.details["episodes"] if r["verdict"] == "diverged"]
    assert rows and first == min(r["first_divergent_step"] for r in rows)
    assert f"actions diverge at step {rows[0]['first_divergent_step']}" in result.message
    assert ("the artifact's output on the training model input and the training path's "
            "state differs by") in result.message
    from paritygate.rootcause import explain

    sequences = gate.evaluate("recurrent_parity", golden=False)
    assert "missing_reset" in sequences.finding_kinds()
    explained, root = explain([sequences, result])
    assert root is not None and (root.check, root.kind) == ("recurrent_parity", "recurrent_state")
    assert explained[1].consequence_of == "recurrent_parity"
    assert explained[1].message.startswith("see recurrent_parity: ")


def test_a_declared_float16_artifact_steps_under_its_tier(pendulum: Path, tmp_path: Path) -> None:
    """The Pendulum actor converted to float16 inside (keep_io_types): undeclared, its actions
    leave the fp32 action_tolerance (1e-4); declared by policy.artifact_dtype, rollout_parity
    takes the fp16/fp32 tier's tolerance, as logits_agreement does, and names its source."""
    built = zb.fp16_converted("float16")(pendulum, tmp_path / "fp16")
    artifact = built["policy"]["artifact"]
    undeclared = _gate(rs.pendulum_config(pendulum), tmp_path / "undeclared",
                       policy={"artifact": artifact})
    result = undeclared.evaluate("rollout_parity", golden=False)
    assert result.status == "fail" and "action_divergence" in result.finding_kinds()
    assert "> action_tolerance 0.0001)" in result.message
    declared = _gate(rs.pendulum_config(pendulum), tmp_path / "declared",
                     policy={"artifact": artifact, "artifact_dtype": "float16"})
    result = declared.evaluate("rollout_parity", golden=False)
    assert result.status == "pass", result.message
    notes = " ".join(result.details["notes"])
    assert "action_tolerance 0.0442 (fp16/fp32 tier; default 0.0001 for fp32)" in notes
    assert 1e-4 < result.metrics["max_action_abs_diff"] < 0.0442
