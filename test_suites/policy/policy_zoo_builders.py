"""Builders of the policy fault zoo: each writes one faulty subject and returns config overrides.

A builder ``build(clean_dir, out_dir)`` reads the clean demo, writes the faulty
checkpoint / artifact / stats into ``out_dir`` and returns the overrides that point
the demo gate at them. The registry is ``policy_zoo.FAULTS``.
"""

from __future__ import annotations

import copy
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

FAULTS_MODULE = "paritygate.demo.faults"

Overrides = dict[str, Any]
Builder = Callable[[Path, Path], Overrides]


# --- helpers the builders share ------------------------------------------------------------------


def _state(clean: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(clean / "policy.safetensors"))


def _save(state: dict[str, Any], path: Path) -> Path:
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    return path


def _manifest(artifact: Path, checkpoint: Path) -> None:
    from paritygate.families.policy.export import write_manifest

    write_manifest(artifact, checkpoint, opset=18)


def _clean_artifact(clean: Path, out: Path, checkpoint: Path) -> Overrides:
    """Copy the clean artifact and give it a manifest for ``checkpoint``."""
    out.mkdir(parents=True, exist_ok=True)
    artifact = out / "policy.onnx"
    shutil.copyfile(clean / "policy.onnx", artifact)
    _manifest(artifact, checkpoint)
    return {"policy": {"checkpoint": str(checkpoint), "artifact": str(artifact)}}


def checkpoint_fault(edit: Callable[[dict[str, Any]], dict[str, Any]]) -> Builder:
    """A faulty checkpoint; the artifact is the clean one with a manifest for the new file."""

    def build(clean: Path, out: Path) -> Overrides:
        ckpt = _save(edit(_state(clean)), out / "policy.safetensors")
        return _clean_artifact(clean, out, ckpt)

    return build


def model_variant(**policy: Any) -> Builder:
    """A faulty factory or preprocessing function from ``paritygate.demo.faults``; clean files."""

    def build(clean: Path, out: Path) -> Overrides:
        return {"policy": copy.deepcopy(policy)}

    return build


def _loaded(model: Any, state: dict[str, Any]) -> Any:
    model.load_state_dict(state, strict=True)
    return model.eval()


def _inference_model(state: dict[str, Any], cls: Any = None) -> Any:
    from paritygate.demo.policy import InferencePolicy, inference_state

    return _loaded((cls or InferencePolicy)(), inference_state(state))


def _export(model: Any, path: Path, output_names: list[str] | None = None) -> Path:
    """The project's exporter (dynamo, dynamic batch axis)."""
    import torch

    from paritygate.families.policy.export import export_onnx

    return export_onnx(model.eval(), torch.zeros(2, 8), path, input_name="obs",
                       output_names=output_names or ["logits"], opset=18)


def _export_legacy(model: Any, path: Path, *, training: bool = False,
                   dynamic_batch: bool = True) -> Path:
    """torch's legacy TorchScript exporter (keeps BatchNorm nodes; can export training mode)."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    mode = torch.onnx.TrainingMode.TRAINING if training else torch.onnx.TrainingMode.EVAL
    axes = {"obs": {0: "batch"}, "logits": {0: "batch"}} if dynamic_batch else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.zeros(2, 8),), str(path), dynamo=False, training=mode,
                          input_names=["obs"], output_names=["logits"], opset_version=18,
                          dynamic_axes=axes)
    return path


def artifact_fault(make: Callable[[Path, dict[str, Any], Path], None]) -> Builder:
    """A faulty artifact for the clean checkpoint, with a correct manifest.

    ``make(clean_dir, state, artifact_path)`` writes the artifact.
    """

    def build(clean: Path, out: Path) -> Overrides:
        out.mkdir(parents=True, exist_ok=True)
        artifact = out / "policy.onnx"
        make(clean, _state(clean), artifact)
        ckpt = clean / "policy.safetensors"
        _manifest(artifact, ckpt)
        return {"policy": {"checkpoint": str(ckpt), "artifact": str(artifact)}}

    return build


def edit_onnx(clean: Path, artifact: Path, edit: Callable[[Any], None]) -> None:
    import onnx

    model = onnx.load(str(clean / "policy.onnx"))
    edit(model)
    onnx.checker.check_model(model)
    onnx.save(model, str(artifact))


# --- weights_load --------------------------------------------------------------------------------


def prefix(text: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda s: {text + k: v for k, v in s.items()}


def rename(s: dict[str, Any]) -> dict[str, Any]:
    s["trunk.0.kernel"] = s.pop("trunk.0.weight")
    return s


def drop_key(s: dict[str, Any]) -> dict[str, Any]:
    del s["policy_head.bias"]
    return s


def reshape(s: dict[str, Any]) -> dict[str, Any]:
    s["policy_head.weight"] = s["policy_head.weight"][:, :32].clone()  # (A, H/2)
    return s


def nan_weight(s: dict[str, Any]) -> dict[str, Any]:
    s["trunk.4.weight"] = s["trunk.4.weight"].clone()
    s["trunk.4.weight"][3, 5] = float("nan")
    return s


def float64(s: dict[str, Any]) -> dict[str, Any]:
    s["trunk.0.weight"] = s["trunk.0.weight"].double()
    return s


# --- batchnorm_export ----------------------------------------------------------------------------


def bn_training_export(clean: Path, state: dict[str, Any], artifact: Path) -> None:
    _export_legacy(_inference_model(state), artifact, training=True)


def _reset_bn(model: Any) -> Any:
    from torch import nn

    for mod in model.modules():
        if isinstance(mod, nn.modules.batchnorm._BatchNorm):
            mod.reset_running_stats()
    return model


def bn_reset_export(clean: Path, state: dict[str, Any], artifact: Path) -> None:
    _export_legacy(_reset_bn(_inference_model(state)), artifact)


def bn_reset_export_folded(clean: Path, state: dict[str, Any], artifact: Path) -> None:
    _export(_reset_bn(_inference_model(state)), artifact)


def bn_nonpersistent(clean: Path, out: Path) -> Overrides:
    """Checkpoint saved from a model whose BN stats are non-persistent; exported the same way."""
    from paritygate.demo import faults

    trained = _state(clean)
    model = faults.build_nonpersistent_bn_training()
    state = {k: v for k, v in trained.items() if k in model.state_dict()}
    ckpt = _save(state, out / "policy.safetensors")
    inference = faults.build_nonpersistent_bn_inference()
    inference.load_state_dict({k: v for k, v in state.items()
                               if k in inference.state_dict()}, strict=True)
    inference.eval()
    artifact = _export(inference, out / "policy.onnx")
    _manifest(artifact, ckpt)
    return {"policy": {
        "checkpoint": str(ckpt), "artifact": str(artifact),
        "training_factory": f"{FAULTS_MODULE}:build_nonpersistent_bn_training",
        "inference_factory": f"{FAULTS_MODULE}:build_nonpersistent_bn_inference",
    }}


# --- head_removal --------------------------------------------------------------------------------


def shared_norm(clean: Path, out: Path) -> Overrides:
    """Training model with a shared LayerNorm; the norm is declared a head and removed."""
    import torch

    state = _state(clean)
    gen = torch.Generator().manual_seed(7)
    state["norm.weight"] = 1.0 + 0.3 * torch.randn(64, generator=gen)
    state["norm.bias"] = 0.3 * torch.randn(64, generator=gen)
    ckpt = _save(state, out / "policy.safetensors")
    over = _clean_artifact(clean, out, ckpt)
    over["policy"].update({
        "training_factory": f"{FAULTS_MODULE}:build_shared_norm_training",
        "training_heads": ["value_head", "aux_head", "norm"],
    })
    return over


def probs_variant(clean: Path, out: Path) -> Overrides:
    """The demo serving ``(logits, probs)``: the inference model returns both, the artifact
    is exported from it on the fly."""
    return {"policy": {"inference_factory": f"{FAULTS_MODULE}:build_probs_inference",
                       "output_names": ["logits", "probs"], "artifact": None,
                       "manifest": None}}


def probs_artifact(served: str, inference_factory: str = f"{FAULTS_MODULE}:build_probs_inference"
                   ) -> Builder:
    """The demo serving ``(logits, probs)`` from ``paritygate.demo.faults.<served>`` (its
    manifest names the clean checkpoint), gated with ``inference_factory``."""

    def build(clean: Path, out: Path) -> Overrides:
        from paritygate.demo import faults

        out.mkdir(parents=True, exist_ok=True)
        state = {k: v for k, v in _state(clean).items()
                 if not k.startswith(("value_head.", "aux_head."))}
        artifact = _export(_loaded(getattr(faults, served)(), state), out / "policy.onnx",
                           output_names=["logits", "probs"])
        ckpt = clean / "policy.safetensors"
        _manifest(artifact, ckpt)
        return {"policy": {"inference_factory": inference_factory,
                           "output_names": ["logits", "probs"], "checkpoint": str(ckpt),
                           "artifact": str(artifact)}}

    return build


def value_head_exported(clean: Path, state: dict[str, Any], artifact: Path) -> None:
    from paritygate.demo import faults
    from paritygate.demo.policy import TrainingPolicy

    wrapper = faults.PolicyAndValue(_loaded(TrainingPolicy(), state))
    _export(wrapper, artifact, output_names=["logits", "value"])


# --- dropout_off ---------------------------------------------------------------------------------


def dropout_artifact(clean: Path, state: dict[str, Any], artifact: Path) -> None:
    from paritygate.demo import faults

    _export(_inference_model(state, faults.HardDropoutInference), artifact)


def random_mask(model: Any) -> None:
    """Insert ``x * (RandomUniformLike(x) > 0.1) / 0.9`` after the first Relu (dropout by hand)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    g = model.graph
    relu = next(n for n in g.node if n.op_type == "Relu")
    src = relu.output[0]
    masked = src + "_masked"
    for node in g.node:
        for i, name in enumerate(node.input):
            if name == src:
                node.input[i] = masked
    g.initializer.extend([numpy_helper.from_array(np.array(0.1, np.float32), "drop_p"),
                          numpy_helper.from_array(np.array(0.9, np.float32), "drop_keep")])
    new = [
        helper.make_node("RandomUniformLike", [src], ["drop_u"], dtype=TensorProto.FLOAT),
        helper.make_node("Greater", ["drop_u", "drop_p"], ["drop_keep_bool"]),
        helper.make_node("Cast", ["drop_keep_bool"], ["drop_mask"], to=TensorProto.FLOAT),
        helper.make_node("Mul", [src, "drop_mask"], ["drop_kept"]),
        helper.make_node("Div", ["drop_kept", "drop_keep"], [masked]),
    ]
    at = list(g.node).index(relu) + 1
    for offset, node in enumerate(new):
        g.node.insert(at + offset, node)


# --- preprocessing_parity ------------------------------------------------------------------------


def stale_stats(clean: Path, out: Path) -> Overrides:
    """Current stats for training; last release's (from a smaller, older sample) beside them."""
    import json

    import numpy as np

    from paritygate.demo import faults
    from paritygate.demo.policy import DISCRETE_FEATURES, probe_observations

    out.mkdir(parents=True, exist_ok=True)
    stats = out / "obs_norm.json"
    shutil.copyfile(clean / "obs_norm.json", stats)
    previous = json.loads(stats.read_text(encoding="utf-8"))
    old = probe_observations(256, seed=98)  # (256, D)
    previous["mean"] = old.mean(0).astype(np.float64).tolist()
    previous["var"] = old.var(0).astype(np.float64).tolist()
    for j in DISCRETE_FEATURES:
        previous["mean"][j], previous["var"][j] = 0.0, 1.0
    stale = out / ("obs_norm" + faults.STALE_STATS_SUFFIX)
    stale.write_text(json.dumps(previous), encoding="utf-8")
    return {"policy": {"preprocessing": {
        "stats": str(stats), "serving": f"{FAULTS_MODULE}:normalize_serving_stale"}}}


def serving(name: str) -> Builder:
    return model_variant(preprocessing={"serving": f"{FAULTS_MODULE}:{name}"})


# --- logits_agreement ----------------------------------------------------------------------------


def _perturbed(state: dict[str, Any], rel: float = 1e-4) -> dict[str, Any]:
    """Every float tensor scaled by 1 +- ``rel`` (random sign, fixed seed): an older checkpoint."""
    import torch

    gen = torch.Generator().manual_seed(11)
    out = {}
    for k, v in state.items():
        if v.is_floating_point():
            sign = torch.randint(0, 2, v.shape, generator=gen).to(v.dtype) * 2 - 1
            v = v * (1 + rel * sign)
        out[k] = v
    return out


def stale_perturbed(clean: Path, out: Path) -> Overrides:
    """Artifact exported from a checkpoint 1e-4 away, with its own (correct) manifest."""
    older = _save(_perturbed(_state(clean)), out / "older" / "policy.safetensors")
    artifact = _export(_inference_model(_perturbed(_state(clean))), out / "policy.onnx")
    _manifest(artifact, older)
    return {"policy": {"checkpoint": str(clean / "policy.safetensors"),
                       "artifact": str(artifact)}}


def fp16_layer(model: Any) -> None:
    """Round the second Gemm's weights to fp16 precision (a layer kept in half precision)."""
    import numpy as np
    from onnx import numpy_helper

    for i, init in enumerate(model.graph.initializer):
        if init.name == "trunk.4.weight":
            w = numpy_helper.to_array(init).astype(np.float16).astype(np.float32)
            model.graph.initializer[i].CopyFrom(numpy_helper.from_array(w, init.name))
            return
    raise LookupError("trunk.4.weight not in the clean artifact")


def temperature(model: Any) -> None:
    """Append ``logits / 0.9`` to the graph (a sampling temperature baked into the export)."""
    import numpy as np
    from onnx import helper, numpy_helper

    g = model.graph
    out = g.output[0].name
    for node in g.node:
        for i, name in enumerate(node.output):
            if name == out:
                node.output[i] = out + "_raw"
    g.initializer.append(numpy_helper.from_array(np.array(0.9, np.float32), "temperature"))
    g.node.append(helper.make_node("Div", [out + "_raw", "temperature"], [out]))


# --- export_integrity ----------------------------------------------------------------------------


def stale_manifest(clean: Path, out: Path) -> Overrides:
    """The clean artifact, but its manifest names an older checkpoint."""
    older = _save(_perturbed(_state(clean)), out / "older" / "policy.safetensors")
    out.mkdir(parents=True, exist_ok=True)
    artifact = out / "policy.onnx"
    shutil.copyfile(clean / "policy.onnx", artifact)
    _manifest(artifact, older)
    return {"policy": {"artifact": str(artifact)}}


def baked_batch(clean: Path, state: dict[str, Any], artifact: Path) -> None:
    _export_legacy(_inference_model(state), artifact, dynamic_batch=False)


def modified_after_export(clean: Path, out: Path) -> Overrides:
    """The clean artifact and manifest, then the artifact edited (producer/doc string)."""
    import onnx

    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(clean / "manifest.json", out / "manifest.json")
    model = onnx.load(str(clean / "policy.onnx"))
    model.doc_string = "hand-edited after export"
    onnx.save(model, str(out / "policy.onnx"))
    return {"policy": {"artifact": str(out / "policy.onnx")}}


# --- artifacts from the user's own pipeline (no manifest) ----------------------------------------


def no_manifest(clean: Path, out: Path) -> Overrides:
    """The clean artifact copied alone: no manifest.json beside it."""
    out.mkdir(parents=True, exist_ok=True)
    artifact = out / "policy.onnx"
    shutil.copyfile(clean / "policy.onnx", artifact)
    return {"policy": {"artifact": str(artifact)}}


def manifest_required(clean: Path, out: Path) -> Overrides:
    """The clean artifact without its manifest, gated with ``require_manifest: true``."""
    over = no_manifest(clean, out)
    over["policy"]["require_manifest"] = True
    return over


def stale_no_manifest(clean: Path, out: Path) -> Overrides:
    """An artifact exported from a checkpoint 1e-4 away, shipped without a manifest."""
    artifact = _export(_inference_model(_perturbed(_state(clean))), out / "policy.onnx")
    return {"policy": {"artifact": str(artifact)}}


def plain_torch_export(clean: Path, out: Path) -> Overrides:
    """The clean checkpoint exported with plain ``torch.onnx.export`` (TorchScript exporter,
    dynamic batch axis), the way a team's own script does it: no paritygate, no manifest."""
    artifact = _export_legacy(_inference_model(_state(clean)), out / "policy.onnx")
    return {"policy": {"artifact": str(artifact)}}


# --- artifacts without a manifest: provenance is numeric, the root cause must still lead --------


def without_manifest(build: Builder) -> Builder:
    """``build``, then its ``manifest.json`` removed: provenance must be proven numerically."""

    def wrapped(clean: Path, out: Path) -> Overrides:
        overrides = build(clean, out)
        (out / "manifest.json").unlink(missing_ok=True)
        return overrides

    return wrapped


def misplaced_bias(clean: Path, state: dict[str, Any], artifact: Path) -> None:
    """trunk.4's bias exported in trunk.0's place (a shifted key in the export script);
    the legacy exporter keeps every tensor under its parameter name."""
    shifted = dict(state)
    shifted["trunk.0.bias"] = state["trunk.4.bias"]
    _export_legacy(_inference_model(shifted), artifact)


def stale_unfolded_no_manifest(clean: Path, out: Path) -> Overrides:
    """Legacy export (tensors keep their names) of a checkpoint 1e-4 away, no manifest."""
    artifact = _export_legacy(_inference_model(_perturbed(_state(clean))), out / "policy.onnx")
    return {"policy": {"artifact": str(artifact)}}


def fp16_converted(declared: str | None) -> Builder:
    """The clean artifact converted to float16 inside, float32 at its inputs and outputs
    (onnxconverter-common's ``convert_float_to_float16(keep_io_types=True)``, the usual way to
    halve a policy for serving), without a manifest; ``declared`` is the config's
    ``policy.artifact_dtype`` (``None``: left at its default)."""

    def build(clean: Path, out: Path) -> Overrides:
        import onnx
        from onnxconverter_common import float16

        out.mkdir(parents=True, exist_ok=True)
        artifact = out / "policy.onnx"
        model = float16.convert_float_to_float16(
            onnx.load(str(clean / "policy.onnx")), keep_io_types=True)
        onnx.save(model, str(artifact))
        policy: dict[str, Any] = {"checkpoint": str(clean / "policy.safetensors"),
                                  "artifact": str(artifact)}
        if declared is not None:
            policy["artifact_dtype"] = declared
        return {"policy": policy}

    return build


# --- rollout_parity (the CartPole subject of rollout_subjects) -----------------------------------


def cartpole_artifact(edit: Callable[[Any], None]) -> Builder:
    """The clean CartPole artifact edited by ``edit(onnx_model)``, with a correct manifest."""

    def build(clean: Path, out: Path) -> Overrides:
        out.mkdir(parents=True, exist_ok=True)
        artifact = out / "policy.onnx"
        edit_onnx(clean, artifact, edit)
        _manifest(artifact, clean / "ppo.zip")
        return {"policy": {"artifact": str(artifact)}}

    return build


def action_bias(delta: float) -> Callable[[Any], None]:
    """Add ``delta`` to the first action's logit bias (``action_net.bias[0]``): only states
    whose top-2 logit margin is below ``delta`` change their greedy action."""

    def edit(model: Any) -> None:
        from onnx import numpy_helper

        for i, init in enumerate(model.graph.initializer):
            if init.name == "action_net.bias":
                bias = numpy_helper.to_array(init).copy()
                bias[0] += delta
                model.graph.initializer[i].CopyFrom(numpy_helper.from_array(bias, init.name))
                return
        raise LookupError("action_net.bias not in the clean CartPole artifact")

    return edit


# --- continuous (Gaussian) policies --------------------------------------------------------------


def cleanrl_stale_artifact(clean: Path, out: Path) -> Overrides:
    """The CleanRL actor exported from weights 1e-3 relative away (an older training step),
    shipped without a manifest: the served Gaussian's mean is another checkpoint's."""
    import torch

    from paritygate.checkpoints import load_state_dict
    from paritygate.demo.continuous import CleanRLActor, probe_observations
    from paritygate.families.policy.export import export_onnx

    state = load_state_dict(clean / "cleanrl.pt", state_dict_key="agent.actor_critic")
    actor = CleanRLActor()
    torch.manual_seed(1)
    actor.load_state_dict({k: v * (1 + 1e-3 * torch.randn_like(v)) for k, v in state.items()
                           if k in actor.state_dict()}, strict=True)
    artifact = export_onnx(actor.eval(), torch.from_numpy(probe_observations(4, 0)),
                           out / "policy.onnx", input_name="obs", output_names=["mean"])
    return {"policy": {"artifact": str(artifact)}}


def cleanrl_fp16(declared: str | None) -> Builder:
    """The CleanRL actor exported from the gated checkpoint and converted to float16 inside
    (``keep_io_types``); ``declared`` is the config's ``policy.artifact_dtype``."""

    def build(clean: Path, out: Path) -> Overrides:
        import onnx
        import torch
        from onnxconverter_common import float16

        from paritygate.checkpoints import load_state_dict
        from paritygate.demo.continuous import CleanRLActor, probe_observations
        from paritygate.families.policy.export import export_onnx

        state = load_state_dict(clean / "cleanrl.pt", state_dict_key="agent.actor_critic")
        actor = CleanRLActor()
        actor.load_state_dict({k: v for k, v in state.items() if k in actor.state_dict()},
                              strict=True)
        out.mkdir(parents=True, exist_ok=True)
        fp32 = export_onnx(actor.eval(), torch.from_numpy(probe_observations(4, 0)),
                           out / "fp32.onnx", input_name="obs", output_names=["mean"])
        artifact = out / "policy.onnx"
        onnx.save(float16.convert_float_to_float16(onnx.load(str(fp32)), keep_io_types=True),
                  str(artifact))
        fp32.unlink()
        policy: dict[str, Any] = {"artifact": str(artifact)}
        if declared is not None:
            policy["artifact_dtype"] = declared
        return {"policy": policy}

    return build
