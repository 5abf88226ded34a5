"""The policy fault zoo: one entry per fault, the check that must catch it, why others fail too.

Each builder writes the faulty checkpoint / artifact / stats into ``out_dir`` (the
clean demo in ``clean_dir`` is only read) and returns the config overrides that
point the demo gate at them. ``also_fails`` is measured, not guessed:
``test_policy_zoo.py`` evaluates all seven checks on every fault and compares.

The ``cartpole`` base is the PPO CartPole policy of ``rollout_subjects``: its faults are
evaluated on the same checks and ``rollout_parity`` (its config steps CartPole-v1 episodes).
Run ``python test_suites/policy/policy_zoo.py [FAULT_ID ...]`` to print the Markdown table kept in
ZOO.md (every fault, or the named ones); ``--shapes`` prints the tables of the Dict-observation
and recurrent subjects (``SUBJECTS``, ``CLEAN_SHAPES``, ``SHAPE_FAULTS``).
"""

from __future__ import annotations

import copy
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import policy_zoo_builders as zb
import rollout_subjects
import shape_zoo_builders as sb
import yaml
from policy_zoo_builders import FAULTS_MODULE, Builder, Overrides
from zoo_checks import zoo_checks

REPO = Path(__file__).resolve().parents[2]
DEMO_CONFIG = REPO / "configs" / "demo-policy.yaml"

POLICY_CHECKS = zoo_checks("policy")
"""The checks of the policy zoo's base subjects, derived from the registry."""
ROLLOUT_CHECKS = (*POLICY_CHECKS, "rollout_parity")
"""The checks of the ``cartpole`` base (its config has a ``policy.rollout`` section)."""


def checks_of(base: str) -> tuple[str, ...]:
    """The checks every fault of ``base`` is evaluated on (its clean subject passes them)."""
    if base in SUBJECTS:
        return SUBJECTS[base].checks
    return ROLLOUT_CHECKS if base == "cartpole" else POLICY_CHECKS



@dataclass(frozen=True)
class Fault:
    """One fault: what it is, which check must fail, the cause its message names."""

    id: str
    check: str
    summary: str
    build: Builder
    causes: tuple[str, ...]
    """Substrings the failing check's message must contain (naming the cause)."""
    also_fails: dict[str, str] = field(default_factory=dict)
    """Other checks that fail on this fault (measured), each with a one-line why."""
    absent: tuple[str, ...] = ()
    """Substrings the failing check's message must not contain (a wrong or doubled cause)."""
    linked: tuple[str, ...] = ()
    """Checks of ``also_fails`` the report must mark as consequences of the root cause
    (``consequence_of``): the root's finding, read from what they measured, explains them."""
    base: str = "demo"
    """The clean subject the fault is built from: the demo (discrete) or one of
    :data:`CONTINUOUS_BASES` (its builder then gets that subject's clean folder), or
    ``cartpole`` (the PPO CartPole policy of ``rollout_subjects``), or one of ``SUBJECTS`` (the
    Dict-observation and recurrent policies)."""
    kind: str | None = None
    """The finding kind the failing check must record (when the fault names one)."""

    @property
    def checks(self) -> tuple[str, ...]:
        return checks_of(self.base)


# --- config --------------------------------------------------------------------------------------


def base_config(clean_dir: Path) -> dict[str, Any]:
    """The committed demo config, pointed at a clean demo build in ``clean_dir``."""
    data = yaml.safe_load(DEMO_CONFIG.read_text(encoding="utf-8"))
    pol = data["policy"]
    pol["checkpoint"] = str(clean_dir / "policy.safetensors")
    pol["artifact"] = str(clean_dir / "policy.onnx")
    pol["preprocessing"]["stats"] = str(clean_dir / "obs_norm.json")
    return data


_CONTINUOUS = "paritygate.demo.continuous"

CONTINUOUS_BASES: dict[str, dict[str, Any]] = {
    # CleanRL's PPO actor-critic: a bare log_std parameter, saved in a training checkpoint
    "cleanrl": {
        "training_factory": f"{_CONTINUOUS}:build_cleanrl_agent",
        "inference_factory": f"{_CONTINUOUS}:build_cleanrl_actor",
        "checkpoint": "cleanrl.pt", "state_dict_key": "agent.actor_critic",
        "training_heads": ["critic", "actor_logstd"], "policy_output": "mean",
        "output_names": ["mean"], "action_space": "continuous",
        "distribution": {"log_std": "parameter", "log_std_key": "actor_logstd",
                         "squash": "clip"},
    },
    # the CleanRL actor serving the env action: its mean clipped to the box [-1, 1]
    "cleanrl_clip": {
        "training_factory": f"{_CONTINUOUS}:build_cleanrl_agent",
        "inference_factory": f"{_CONTINUOUS}:build_cleanrl_clipped_actor",
        "checkpoint": "cleanrl.pt", "state_dict_key": "agent.actor_critic",
        "training_heads": ["critic", "actor_logstd"], "policy_output": "mean",
        "output_names": ["action"], "action_space": "continuous",
        "distribution": {"log_std": "parameter", "log_std_key": "actor_logstd",
                         "squash": "clip", "serving_output": "action"},
    },
    # a SAC actor serving the env action and its log_std (tanh, scale, bias, clamp)
    "sac": {
        "training_factory": f"{_CONTINUOUS}:build_sac_agent",
        "inference_factory": f"{_CONTINUOUS}:build_sac_actor",
        "checkpoint": "sac.safetensors", "training_heads": ["qf1"], "policy_output": "mean",
        "output_names": ["action", "log_std"], "action_space": "continuous",
        "distribution": {"log_std": "output", "log_std_key": "log_std", "squash": "tanh",
                         "log_std_clamp": [-5.0, 2.0], "action_scale": [2.0, 1.0],
                         "action_bias": [0.5, -0.25], "serving_output": "action"},
    },
}


def build_continuous(clean_dir: Path) -> Path:
    """The clean continuous subjects (both checkpoints) in ``clean_dir``."""
    from paritygate.demo import continuous

    continuous.build(clean_dir)
    return clean_dir


def continuous_config(base: str, clean_dir: Path, out_dir: Path) -> dict[str, Any]:
    """A continuous subject's gate config (artifact exported on the fly into ``out_dir``)."""
    policy = copy.deepcopy(CONTINUOUS_BASES[base])
    policy["checkpoint"] = str(clean_dir / policy["checkpoint"])
    policy["probes"] = {"generator": f"{_CONTINUOUS}:probe_observations", "count": 32}
    return {"name": f"zoo-{base}", "family": "policy", "seed": 0, "policy": policy,
            "report_dir": str(out_dir / "reports")}


def merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge ``overrides`` into a copy of ``base`` (mappings merge, anything else replaces)."""
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def fault_config(clean_dir: Path, out_dir: Path, overrides: Overrides, base: str = "demo"
                 ) -> Any:
    """A validated GateConfig for a fault (lives in ``out_dir``)."""
    from paritygate.load import config_from_dict

    if base == "demo":
        start = base_config(clean_dir)
    elif base in SUBJECTS:
        start = SUBJECTS[base].config(clean_dir)
    elif base == "cartpole":
        start = rollout_subjects.cartpole_config(clean_dir)
    else:
        start = continuous_config(base, clean_dir, out_dir)
    data = merge(start, overrides)
    data["name"] = "zoo-" + out_dir.name.replace("_", "-")[:60]
    data["golden"] = {"dir": str(out_dir / "golden")}
    return config_from_dict(data, out_dir / "gate.yaml")


def evaluate_all(config: Any, checks: tuple[str, ...] = POLICY_CHECKS) -> dict[str, Any]:
    """Every policy check's verdict on ``config`` (or those of ``checks``), without golden."""
    from paritygate.gate import Gate

    gate = Gate(config)
    return {cid: gate.evaluate(cid, golden=False) for cid in checks}


# --- Dict-observation and recurrent subjects ---------------------------------------------------


@dataclass(frozen=True)
class Subject:
    """A clean subject besides the demo: how to build it, its config, the checks it runs."""

    build: Any
    """``build(folder)`` writes the checkpoint, artifact, manifest and ``gate.yaml``."""
    checks: tuple[str, ...]

    def config(self, clean_dir: Path) -> dict[str, Any]:
        """The subject's ``gate.yaml`` with its relative paths made absolute."""
        data = yaml.safe_load((clean_dir / "gate.yaml").read_text(encoding="utf-8"))
        pol = data["policy"]
        for key in ("checkpoint", "artifact"):
            pol[key] = str(clean_dir / pol[key])
        for spec in pol.get("inputs", []):
            pre = spec.get("preprocessing") if isinstance(spec, dict) else None
            if pre and pre.get("stats"):
                pre["stats"] = str(clean_dir / pre["stats"])
        return data


def _subjects() -> dict[str, Subject]:
    from paritygate.demo import shapes

    return {"dict": Subject(shapes.build_dict, POLICY_CHECKS),
            "recurrent": Subject(shapes.build_recurrent, (*POLICY_CHECKS, "recurrent_parity"))}


SUBJECTS = _subjects()


@dataclass(frozen=True)
class Clean:
    """A clean variant of a subject that must pass every check it runs."""

    id: str
    base: str
    summary: str
    build: Builder = lambda clean, out: {}


CLEAN_SHAPES: tuple[Clean, ...] = (
    Clean("dict", "dict", "Dict observation (image, vector, goal) as one dict argument"),
    Clean("dict_npz_probes", "dict", "the Dict probes from an .npz, one array per key",
          sb.npz_probes),
    Clean("dict_keyword_call", "dict", "forward(image=..., vector=..., goal=...)",
          sb.keyword_call),
    Clean("recurrent", "recurrent", "LSTM actor, learned initial state, episode-start input"),
    Clean("recurrent_gate_reset", "recurrent",
          "LSTM actor without an episode-start input: the gate resets the state",
          sb.gate_reset),
)

SHAPE_FAULTS: tuple[Fault, ...] = (
    Fault("dict_image_scale", "preprocessing_parity",
          "serving scales the image key by 1/256 instead of 1/255",
          sb.serving(0, "scale_image_serving_256"), ("input 'image':", "differs by"),
          base="dict", kind="stats_differ"),
    Fault("dict_image_scale_missing", "preprocessing_parity",
          "serving passes the 8-bit image key unscaled (the /255 missing)",
          sb.serving(0, "scale_image_serving_missing"), ("input 'image':", "/255"),
          absent=("input 'vector'",), base="dict", kind="image_scale_missing"),
    Fault("dict_vector_normalisation_missing", "preprocessing_parity",
          "serving passes the vector key raw", sb.serving(1, "normalize_vector_missing"),
          ("input 'vector':", "normalisation missing"), absent=("input 'image'",),
          base="dict", kind="normalisation_missing"),
    Fault("dict_inputs_swapped", "export_integrity",
          "the export feeds ONNX input 'vector' into the model's goal and 'goal' into vector",
          sb.dict_inputs_swapped, ("inputs swapped", "'vector' and 'goal'"),
          {"logits_agreement": "the swapped inputs change the artifact's logits"},
          base="dict", kind="inputs_swapped"),
    Fault("recurrent_wrong_initial_state", "recurrent_parity",
          "the serving export resets the state to zeros, not the learned initial state",
          sb.recurrent_artifact(sb.zero_reset), ("wrong initial state", "first over tolerance"),
          base="recurrent", kind="wrong_initial_state"),
    Fault("recurrent_missing_reset", "recurrent_parity",
          "the serving export ignores its episode-start input",
          sb.recurrent_artifact(sb.no_reset), ("missing reset", "'episode_start'"),
          base="recurrent", kind="missing_reset"),
    Fault("recurrent_state_swapped", "recurrent_parity",
          "the serving export returns c under h_out and h under c_out",
          sb.recurrent_artifact(sb.swapped_states),
          ("state outputs swapped", "'c_out' and 'h_out'"),
          {"export_integrity": "its declared outputs h_out and c_out differ from the "
                               "inference model's"},
          base="recurrent", kind="state_swapped", linked=("export_integrity",)),
    Fault("recurrent_stale_artifact", "recurrent_parity",
          "the LSTM actor exported from weights 1e-3 relative away, no manifest",
          sb.recurrent_stale, ("single step differs", "not a state-handling fault"),
          {"logits_agreement": "the artifact computes another checkpoint's logits",
           "export_integrity": "no manifest, and its weights are another checkpoint's"},
          absent=("wrong initial state", "missing reset"),
          base="recurrent", kind="step_outputs_differ"),
    Fault("recurrent_state_shape", "recurrent_parity",
          "the serving export returns h as (num_layers, batch, hidden)",
          sb.recurrent_artifact(sb.layered_state), ("state shape mismatch", "'h_out'"),
          {"export_integrity": "its declared output h_out has another shape than the "
                               "inference model's"},
          base="recurrent", kind="state_shape", linked=("export_integrity",)),
)

SHAPE_FAULTS_BY_ID = {f.id: f for f in SHAPE_FAULTS}


def failing(results: dict[str, Any]) -> set[str]:
    return {cid for cid, r in results.items() if r.status in ("fail", "error")}


# --- the registry --------------------------------------------------------------------------------

_F = FAULTS_MODULE
_RANDOM_INIT = "the policy runs with random-init tensors where the checkpoint did not land"

FAULTS: tuple[Fault, ...] = (
    # weights_load
    Fault("ddp_prefix", "weights_load", "checkpoint keys carry DDP's 'module.' prefix",
          zb.checkpoint_fault(zb.prefix("module.")), ("'module.' prefix",),
          {"batchnorm_export": "running stats absent under the model's key names",
           "head_removal": "training and inference models are both random init, differently",
           "logits_agreement": "the training model is random init; the artifact is trained"}),
    Fault("compile_prefix", "weights_load", "checkpoint keys carry torch.compile's '_orig_mod.'",
          zb.checkpoint_fault(zb.prefix("_orig_mod.")), ("'_orig_mod.' prefix",),
          {"batchnorm_export": "running stats absent under the model's key names",
           "head_removal": "training and inference models are both random init, differently",
           "logits_agreement": "the training model is random init; the artifact is trained"}),
    Fault("renamed_key", "weights_load", "trunk.0.weight saved as trunk.0.kernel",
          zb.checkpoint_fault(zb.rename), ("key renamed?", "'trunk.0.weight'", "'trunk.0.kernel'"),
          {"head_removal": "trunk.0.weight is random init in both models, differently",
           "logits_agreement": "the training model's first layer is random init"}),
    Fault("missing_key", "weights_load", "policy_head.bias not saved",
          zb.checkpoint_fault(zb.drop_key), ("missing from the checkpoint", "policy_head.bias"),
          {"head_removal": "policy_head.bias is random init in both models, differently",
           "logits_agreement": "the training model's policy bias is random init"}),
    Fault("shape_change", "weights_load", "policy_head.weight saved with half its columns",
          zb.checkpoint_fault(zb.reshape), ("shape mismatch for 'policy_head.weight'",),
          {"head_removal": "policy_head.weight is random init in both models, differently",
           "logits_agreement": "the training model's policy weight is random init"}),
    Fault("nan_weight", "weights_load", "one NaN in trunk.4.weight",
          zb.checkpoint_fault(zb.nan_weight), ("'trunk.4.weight' has 1 NaN/Inf",),
          absent=("differ from the file after loading",),
          also_fails={"batchnorm_export": "torch reference outputs are NaN",
           "head_removal": "training and inference policy outputs are NaN",
           "logits_agreement": "the reference output has NaN values"}),
    Fault("silent_nonstrict", "weights_load",
          "inference loader silently skips policy_head.bias (stays random init)",
          zb.model_variant(inference_factory=f"{_F}:build_skipping_load_inference"),
          ("differ from the file after loading", "policy_head.bias"),
          {"head_removal": "inference policy_head.bias differs from the training model's"}),
    Fault("float64_tensor", "weights_load", "trunk.0.weight saved as float64",
          zb.checkpoint_fault(zb.float64), ("dtype mismatch for 'trunk.0.weight'", "float64")),
    # batchnorm_export
    Fault("bn_training_export", "batchnorm_export",
          "legacy export with training=TrainingMode.TRAINING (BN uses batch stats)",
          zb.artifact_fault(zb.bn_training_export),
          ("BatchNormalization exported in training mode",),
          {"dropout_off": "the same export left Dropout nodes in training mode",
           "logits_agreement": "batch statistics and dropout change the artifact's logits",
           "batch_invariance": "BatchNorm in training mode makes a row's output depend on "
                               "its batch-mates"}),
    Fault("bn_stats_reset", "batchnorm_export",
          "artifact exported after reset_running_stats() (legacy exporter keeps BN nodes)",
          zb.artifact_fault(zb.bn_reset_export), ("match no BatchNorm running statistics",),
          {"logits_agreement": "mean 0 / var 1 normalisation changes the artifact's logits"}),
    Fault("bn_stats_reset_folded", "batchnorm_export",
          "artifact exported after reset_running_stats() (dynamo exporter folds BN into Gemm)",
          zb.artifact_fault(zb.bn_reset_export_folded),
          ("BatchNorm statistics reset before export", "folded"),
          {"logits_agreement": "mean 0 / var 1 normalisation changes the artifact's logits"}),
    Fault("bn_nonpersistent", "batchnorm_export",
          "BN running stats registered non-persistent: never saved, default at reload",
          zb.bn_nonpersistent, ("not in the checkpoint", "non-persistent")),
    # head_removal
    Fault("index_shift", "head_removal",
          "inference trunk without Dropout entries: Sequential indices shift by one",
          zb.model_variant(inference_factory=f"{_F}:build_no_dropout_inference"),
          ("inference model has parameters the training model lacks",),
          {"weights_load": "shifted keys: missing, unexpected and shape-mismatched tensors"}),
    Fault("shared_norm_removed", "head_removal",
          "the LayerNorm shared by all heads declared a training head and removed",
          zb.shared_norm, ("a step (shared norm, activation) was removed",),
          {"logits_agreement": "the artifact (no norm) differs from the training model"}),
    Fault("skipped_relu", "head_removal", "inference forward skips the trunk's last ReLU",
          zb.model_variant(inference_factory=f"{_F}:build_skipped_relu_inference"),
          ("a step (shared norm, activation) was removed",)),
    Fault("value_head_exported", "head_removal", "artifact also outputs the value head",
          zb.artifact_fault(zb.value_head_exported), ("undeclared outputs ['value']",),
          {"export_integrity": "artifact outputs differ from the declared ['logits']"}),
    Fault("dropout_in_serving_forward", "head_removal",
          "F.dropout(training=True) in the inference forward: randomness, not a removed step",
          zb.model_variant(inference_factory=f"{_F}:build_hard_dropout_inference"),
          ("inference model is not deterministic", "see dropout_off"),
          absent=("a step (shared norm, activation) was removed",),
          also_fails={"dropout_off": "repeated forwards of the inference model differ"}),
    # dropout_off
    Fault("forced_train_mode", "dropout_off", "inference model's train() ignores mode=False",
          zb.model_variant(inference_factory=f"{_F}:build_forced_train_inference"),
          ("still in training mode", "inference model"),
          {"head_removal": "training-mode dropout makes the inference model non-deterministic"}),
    Fault("hardcoded_dropout", "dropout_off", "F.dropout(training=True) in the inference forward",
          zb.model_variant(inference_factory=f"{_F}:build_hard_dropout_inference"),
          ("torch eval forward is not deterministic",),
          {"head_removal": "names the inference model's randomness (dropout_in_serving_forward)"}),
    Fault("stochastic_depth", "dropout_off", "inference forward skips a block with torch.rand",
          zb.model_variant(inference_factory=f"{_F}:build_stochastic_depth_inference"),
          ("torch eval forward is not deterministic",),
          {"head_removal": "the inference model is not deterministic: randomness named"}),
    Fault("artifact_dropout", "dropout_off",
          "artifact exported from a forward with F.dropout(training=True)",
          zb.artifact_fault(zb.dropout_artifact), ("Dropout in training mode",)),
    # ONNX Runtime's CPU Dropout kernel does not drop at inference even with training_mode
    # set, so only the graph lint sees this one (outputs equal torch eval today).
    Fault("artifact_random_mask", "dropout_off",
          "RandomUniformLike-driven mask inserted into the graph",
          zb.artifact_fault(lambda c, s, a: zb.edit_onnx(c, a, zb.random_mask)),
          ("RandomUniformLike", "artifact is not deterministic"),
          {"batchnorm_export": "random masks make rows depend on the call",
           "logits_agreement": "the mask changes the artifact's logits",
           "batch_invariance": "a fresh random mask per call moves every row"}),
    # batch_invariance (its own zoo, batch_zoo.py, holds the artifact formats and noise cases)
    Fault("serving_batch_stats", "batch_invariance",
          "serving preprocessing re-centres each batch on its own mean",
          zb.model_variant(preprocessing={"serving": "batch_zoo:normalize_batch_stats"}),
          ("normalises with the batch's own statistics",),
          {"preprocessing_parity": "batch-centred inputs differ from the training inputs"}),
    # preprocessing_parity
    Fault("stale_norm_stats", "preprocessing_parity", "serving loads last release's stats",
          zb.stale_stats, ("differs by", "stale stats")),
    Fault("missing_normalisation", "preprocessing_parity", "serving passes raw observations",
          zb.serving("normalize_serving_missing"), ("normalisation missing", "raw input")),
    Fault("different_epsilon", "preprocessing_parity", "serving epsilon 1e-5 instead of 1e-8",
          zb.serving("normalize_serving_epsilon"), ("feature 5 differs by", "another epsilon")),
    Fault("different_clip", "preprocessing_parity", "serving clips at 5 instead of 10",
          zb.serving("normalize_serving_clip"), ("differs by", "another clip range")),
    Fault("sign_flipped_feature", "preprocessing_parity",
          "serving normaliser gives feature 1 the opposite sign",
          zb.serving("normalize_serving_sign_flipped"),
          ("differs by", "features [1] have the opposite sign on the serving side"),
          absent=("normalisation statistics differ",)),
    Fault("different_fill", "preprocessing_parity", "serving fills missing values with 0",
          zb.serving("normalize_serving_fill_zero"),
          ("missing_value input", "missing-value fill differs: training gives", "serving gives"),
          absent=("normalisation statistics differ",)),
    Fault("fill_where_training_propagates", "preprocessing_parity",
          "training propagates NaN, serving fills missing values with the mean",
          zb.model_variant(preprocessing={
              "training": f"{_F}:normalize_training_propagate",
              "serving": "paritygate.demo.policy:normalize_serving"}),
          ("missing-value fill differs: training propagates NaN, serving gives",),
          absent=("normalisation statistics differ",)),
    Fault("nonfinite_other_positions", "preprocessing_parity",
          "serving guards a log transform: finite where training gives NaN (negative input)",
          zb.model_variant(preprocessing={
              "training": f"{_F}:normalize_training_log",
              "serving": f"{_F}:normalize_serving_log_guarded"}),
          ("non-finite values at different positions on extreme_low input",
           "training at features [5]"),
          absent=("missing-value fill differs",)),
    Fault("different_clip_extremes_only", "preprocessing_parity",
          "serving clips at 5; probes without missing values (edge_cases: [extremes])",
          zb.model_variant(preprocessing={"serving": f"{_F}:normalize_serving_clip"},
                           probes={"edge_cases": ["extremes"]}),
          ("another clip range",)),
    # logits_agreement
    Fault("stale_artifact_1e-4", "logits_agreement",
          "artifact exported from a checkpoint 1e-4 relative away (own manifest)",
          zb.stale_perturbed, ("artifact logits differ", "stale artifact",
                               "not built from this checkpoint (0/6"),
          {"export_integrity": "the manifest names the older checkpoint"}),
    Fault("fp16_layer", "logits_agreement", "trunk.4 weights rounded to fp16 in the artifact",
          zb.artifact_fault(lambda c, s, a: zb.edit_onnx(c, a, zb.fp16_layer)),
          ("artifact logits differ", "low-precision layer")),
    Fault("temperature_baked", "logits_agreement", "artifact divides logits by 0.9",
          zb.artifact_fault(lambda c, s, a: zb.edit_onnx(c, a, zb.temperature)),
          ("temperature baked into the artifact",)),
    # export_integrity
    Fault("stale_manifest", "export_integrity", "manifest names another checkpoint's sha256",
          zb.stale_manifest, ("stale artifact",)),
    Fault("batch_axis_baked", "export_integrity", "legacy export without dynamic_axes (batch 2)",
          zb.artifact_fault(zb.baked_batch), ("batch axis of input 'obs' is baked",),
          {"batchnorm_export": "batch sizes 1 and 7 cannot run: batch independence unproven"}),
    Fault("modified_after_export", "export_integrity", "artifact edited after its manifest",
          zb.modified_after_export, ("modified after export",)),
    Fault("stale_artifact_no_manifest", "export_integrity",
          "artifact exported from a checkpoint 1e-4 relative away, no manifest",
          zb.stale_no_manifest,
          ("artifact was not built from this checkpoint", "0/6 weight initializers match"),
          also_fails={"logits_agreement": "the artifact computes another checkpoint's policy"}),
    Fault("misplaced_bias", "export_integrity",
          "trunk.4.bias exported in trunk.0.bias's place (legacy exporter, names kept)",
          zb.artifact_fault(zb.misplaced_bias),
          ("sit in the wrong layer", "'trunk.0.bias' holds the checkpoint's 'trunk.4.bias'"),
          {"logits_agreement": "the first layer adds another layer's bias"},
          linked=("logits_agreement",)),
    Fault("stale_unfolded_no_manifest", "export_integrity",
          "legacy export of a checkpoint 1e-4 relative away, no manifest (names kept)",
          zb.stale_unfolded_no_manifest,
          ("artifact was not built from this checkpoint", "another checkpoint's"),
          absent=("a changed graph",),
          also_fails={"logits_agreement": "the artifact computes another checkpoint's policy",
                      "batchnorm_export": "its BatchNorm statistics are the other checkpoint's"},
          linked=("logits_agreement", "batchnorm_export")),
    Fault("ddp_prefix_no_manifest", "weights_load",
          "'module.' prefix on every key; the clean artifact without a manifest",
          zb.without_manifest(zb.checkpoint_fault(zb.prefix("module."))), ("'module.' prefix",),
          {"batchnorm_export": "running stats absent under the model's key names",
           "head_removal": "training and inference models are both random init, differently",
           "logits_agreement": "the training model is random init; the artifact is trained",
           "export_integrity": "the inference model it compares with is random init"},
          linked=("export_integrity", "logits_agreement")),
    Fault("bn_stats_reset_no_manifest", "batchnorm_export",
          "artifact exported after reset_running_stats(), legacy exporter, no manifest",
          zb.without_manifest(zb.artifact_fault(zb.bn_reset_export)),
          ("match no BatchNorm running statistics",),
          {"logits_agreement": "mean 0 / var 1 normalisation changes the artifact's logits",
           "export_integrity": "only the BatchNorm statistics initializers differ"},
          linked=("export_integrity", "logits_agreement")),
    Fault("temperature_baked_no_manifest", "logits_agreement",
          "artifact divides logits by 0.9, no manifest",
          zb.without_manifest(zb.artifact_fault(
              lambda c, s, a: zb.edit_onnx(c, a, zb.temperature))),
          ("temperature baked into the artifact",),
          {"export_integrity": "every initializer matches; the graph's output differs"},
          linked=("export_integrity",)),
    Fault("fp16_conversion_undeclared", "export_integrity",
          "artifact converted to float16 inside (keep_io_types), policy.artifact_dtype not set",
          zb.fp16_converted(None),
          ("precision conversion: the artifact stores its weights in float16",
           "6/6 weight initializers are this checkpoint's tensors cast to float16",
           "set policy.artifact_dtype: float16"),
          {"logits_agreement": "float16 weights held to the float32 limit"},
          absent=("not built from this checkpoint", "another checkpoint"),
          linked=("logits_agreement",)),
    # continuous actions (Gaussian policies): the served actor's action transform
    Fault("sac_missing_tanh", "logits_agreement",
          "served SAC actor returns bias + scale * mean: the tanh squash is missing",
          zb.model_variant(inference_factory=f"{_CONTINUOUS}:build_sac_actor_without_tanh"),
          ("the tanh squash is missing on the serving side",),
          {"head_removal": "the served actor's forward skips the tanh"},
          linked=("head_removal",), base="sac"),
    Fault("sac_action_scale_missing", "logits_agreement",
          "served SAC actor returns bias + tanh(mean): the action scale is not applied",
          zb.model_variant(inference_factory=f"{_CONTINUOUS}:build_sac_actor_without_scale"),
          ("the action scale is not applied",),
          {"head_removal": "the served actor's forward skips the scale"},
          linked=("head_removal",), base="sac"),
    Fault("sac_action_bias_missing", "logits_agreement",
          "served SAC actor returns scale * tanh(mean): the action bias is not applied",
          zb.model_variant(inference_factory=f"{_CONTINUOUS}:build_sac_actor_without_bias"),
          ("the action bias is not applied",),
          {"head_removal": "the served actor's forward skips the bias"},
          linked=("head_removal",), base="sac"),
    Fault("sac_log_std_clamp_differs", "logits_agreement",
          "served SAC actor clamps log_std at [-3, 2], training at [-5, 2]",
          zb.model_variant(inference_factory=f"{_CONTINUOUS}:build_sac_actor_other_clamp"),
          ("log_std clamp differs", "held at -3"),
          {"export_integrity": "its declared output log_std differs from the training "
                               "model's"},
          base="sac", linked=("export_integrity",), kind="log_std_clamp_differs"),
    Fault("sac_log_std_clamp_looser", "logits_agreement",
          "served SAC actor clamps log_std at [-20, 2] (its second output), training at [-5, 2]",
          zb.model_variant(inference_factory=f"{_CONTINUOUS}:build_sac_actor_looser_clamp"),
          ("log_std clamp differs", "training model's log_std is held at -5",
           "serving clamp is looser or missing", "declared log_std_clamp [-5.0, 2.0]"),
          {"export_integrity": "its declared output log_std differs from the training "
                               "model's"},
          base="sac", linked=("export_integrity",), kind="log_std_clamp_differs"),
    Fault("cleanrl_action_clip_differs", "logits_agreement",
          "served CleanRL actor clips its action at 0.1, the declared box (squash: clip) at 1",
          zb.model_variant(inference_factory=f"{_CONTINUOUS}:build_cleanrl_actor_other_clip"),
          ("the action clip bound differs", "clips the mean at 0.1 from above and at -0.1 "
           "from below", "the declared clip is [-1, 1]"),
          {"head_removal": "the served actor's forward clips at another bound"},
          absent=("a step (shared norm, activation) was removed",),
          linked=("head_removal",), base="cleanrl_clip", kind="action_clip_differs"),
    Fault("cleanrl_fp16_undeclared", "export_integrity",
          "CleanRL actor converted to float16 inside (keep_io_types), artifact_dtype not set",
          zb.cleanrl_fp16(None),
          ("precision conversion: the artifact stores its weights in float16",
           "set policy.artifact_dtype: float16"),
          {"logits_agreement": "float16 weights held to the float32 limits (the mean's and "
                               "the Gaussian's)"},
          linked=("logits_agreement",), base="cleanrl", kind="undeclared_precision"),
    Fault("cleanrl_stale_artifact", "export_integrity",
          "CleanRL actor exported from weights 1e-3 relative away, no manifest",
          zb.cleanrl_stale_artifact,
          ("artifact was not built from this checkpoint",),
          {"logits_agreement": "the served Gaussian's mean is another checkpoint's: action and "
                               "log-prob deltas over their limits"},
          linked=("logits_agreement",), base="cleanrl"),
    Fault("log_std_parameter_undeclared", "weights_load",
          "CleanRL actor-critic: the bare actor_logstd parameter not declared training-only",
          zb.model_variant(training_heads=["critic"]),
          ("unexpected checkpoint keys", "actor_logstd"), base="cleanrl"),
    Fault("second_output_differs", "export_integrity",
          "artifact serves probs = softmax(logits / 0.5) as its second declared output; the "
          "inference model serves softmax(logits)",
          zb.probs_artifact("HotProbsInference"),
          ("declared output 'probs' (output_names[1]) differs from the inference model's",),
          kind="declared_output_differs"),
    Fault("second_output_nan", "export_integrity",
          "artifact serves NaN as its second declared output 'probs'",
          zb.probs_artifact("NanProbsInference"),
          ("the artifact's declared output 'probs' (output_names[1]) has", "NaN"),
          kind="declared_output_nonfinite"),
    Fault("second_output_unmatched", "export_integrity",
          "artifact serves (logits, probs); the inference model returns the logits alone",
          zb.probs_artifact("ProbsInference", "paritygate.demo.policy:build_inference_model"),
          ("'probs' (output_names[1]) has no counterpart in the inference model's result",),
          kind="declared_output_unmatched"),
    Fault("manifest_required_missing", "export_integrity",
          "clean artifact without manifest.json, policy.require_manifest: true",
          zb.manifest_required, ("no manifest at", "policy.require_manifest is true")),
    # rollout_parity: the PPO CartPole policy, stepped in CartPole-v1
    Fault("rollout_stale_velocity_stats", "rollout_parity",
          "serving normalises the pole's angular velocity with last release's mean",
          zb.model_variant(preprocessing={
              "serving": "rollout_models:normalize_serving_stale_velocity"}),
          ("actions diverge at step", "serving preprocessing's model input differs by 0.3"),
          {"preprocessing_parity": "feature 3 is normalised with another mean"},
          base="cartpole"),
    Fault("rollout_action_bias", "rollout_parity",
          "artifact's first action logit shifted by 0.05 (flips only actions decided by less)",
          zb.cartpole_artifact(zb.action_bias(0.05)),
          ("actions diverge at step", "logit margin",
           "the artifact's output on the training model input differs by 0.05"),
          {"logits_agreement": "the artifact's logits differ by 0.05 on the probes"},
          base="cartpole"),
    Fault("rollout_nan_serving_input", "rollout_parity",
          "serving marks the cart velocity missing (NaN) below -0.3: NaN actions there",
          zb.model_variant(preprocessing={"serving": "rollout_models:nan_action_serving"}),
          ("policy output holds NaN/Inf at step",),
          {"preprocessing_parity": "NaN where training gives finite values"},
          base="cartpole"),
    Fault("rollout_env_ignores_seed", "rollout_parity",
          "the environment factory's reset ignores the seed: each path starts elsewhere",
          zb.model_variant(rollout={"env": None, "factory": "rollout_models:unseeded_cartpole"}),
          ("not reproducible under its reset seed",), base="cartpole"),
)

FAULTS_BY_ID = {f.id: f for f in FAULTS}


def main(ids: list[str]) -> int:
    """Build the demo, run every fault (or those in ``ids``), print ZOO.md's Markdown table."""
    from paritygate.demo import policy

    with tempfile.TemporaryDirectory() as tmp:
        clean = Path(tmp) / "clean"
        policy.build(clean)
        continuous = build_continuous(Path(tmp) / "clean-continuous")
        cartpole = Path(tmp) / "clean-cartpole"
        print("| fault | check | message excerpt | also fails (why) |")
        print("|---|---|---|---|")
        for fault in (f for f in FAULTS if not ids or f.id in ids):
            out = Path(tmp) / fault.id
            source = {"demo": clean, "cartpole": cartpole}.get(fault.base, continuous)
            if fault.base == "cartpole" and not source.exists():
                rollout_subjects.train_cartpole(source)
            results = evaluate_all(fault_config(source, out, fault.build(source, out),
                                                fault.base), fault.checks)
            msg = results[fault.check].message.replace("|", "\\|")
            excerpt = msg if len(msg) <= 160 else msg[:157] + "..."
            also = sorted(failing(results) - {fault.check})
            why = "<br>".join(f"`{c}`: {fault.also_fails.get(c, '(not in registry)')}"
                              for c in also) or "—"
            print(f"| `{fault.id}` | `{fault.check}` | {excerpt} | {why} |", flush=True)
    return 0


def main_shapes() -> int:
    """Build the Dict and recurrent subjects, run their clean variants and faults, print the
    Markdown tables of ZOO.md's second section."""
    with tempfile.TemporaryDirectory() as tmp:
        cleans = {}
        for name, subject in SUBJECTS.items():
            cleans[name] = Path(tmp) / name
            subject.build(cleans[name])
        print("| clean variant | subject | what | checks |")
        print("|---|---|---|---|")
        for clean in CLEAN_SHAPES:
            out = Path(tmp) / clean.id
            config = fault_config(cleans[clean.base], out,
                                  clean.build(cleans[clean.base], out), clean.base)
            results = evaluate_all(config, SUBJECTS[clean.base].checks)
            states = ", ".join(f"{n} {s}" for s in ("pass", "skip", "fail", "error")
                               if (n := sum(r.status == s for r in results.values())))
            print(f"| `{clean.id}` | {clean.base} | {clean.summary} | {states} |",
                  flush=True)
        print()
        print("| fault | check | message excerpt | also fails (why) |")
        print("|---|---|---|---|")
        for fault in SHAPE_FAULTS:
            out = Path(tmp) / fault.id
            results = evaluate_all(fault_config(cleans[fault.base], out,
                                                fault.build(cleans[fault.base], out),
                                                fault.base), SUBJECTS[fault.base].checks)
            msg = results[fault.check].message.replace("|", "\\|")
            excerpt = msg if len(msg) <= 160 else msg[:157] + "..."
            also = sorted(failing(results) - {fault.check})
            why = "<br>".join(f"`{c}`: {fault.also_fails.get(c, '(not in registry)')}"
                              for c in also) or "—"
            print(f"| `{fault.id}` | `{fault.check}` | {excerpt} | {why} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main_shapes() if sys.argv[1:] == ["--shapes"] else main(sys.argv[1:]))
