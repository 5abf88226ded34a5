"""ONNX export of an inference policy, with a manifest proving where it came from.

``manifest.json`` records the sha256 of the source checkpoint and of the
artifact, the exporter, opset and library versions; ``export_integrity`` checks
it so a stale artifact built from another checkpoint cannot ship.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import warnings
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paritygate.errors import InputError
from paritygate.files import atomic_write_bytes, atomic_write_text

EXPORTER_NOISE_LOGGERS: tuple[str, ...] = (
    # one warning per optional torchvision op the exporter cannot register
    "torch.onnx._internal.exporter._registration",
    # "Evaluation failed: cannot reshape array ...": constant folding tried an op on a
    # symbolic (dynamic batch) shape, gave up and kept the node; the export is unaffected
    "onnxscript.optimizer._constant_folding",
)


@contextlib.contextmanager
def quiet_exporter() -> Iterator[None]:
    """Silence the exporter's known-harmless log lines and warnings for one export only."""
    loggers = [logging.getLogger(name) for name in EXPORTER_NOISE_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def export_onnx(
    model: Any,
    example: Any,
    path: Path,
    *,
    input_name: str | None = None,
    output_names: list[str],
    opset: int = 18,
    input_names: list[str] | None = None,
) -> Path:
    """Export ``model`` (eval mode) with a dynamic batch axis, through torch's dynamo exporter.

    ``example`` is one tensor, or a tuple of tensors for the positional inputs
    ``input_names``. The file is written atomically: the export goes to a temp folder first.
    """
    import torch

    model.eval()
    names = list(input_names or [input_name or "obs"])
    examples = example if isinstance(example, tuple) else (example,)
    batch = torch.export.Dim("batch", min=1, max=1 << 16)
    with tempfile.TemporaryDirectory() as tmp, quiet_exporter():
        tmp_path = Path(tmp) / "model.onnx"
        program = torch.onnx.export(
            model,
            examples,
            input_names=names,
            output_names=output_names,
            opset_version=opset,
            dynamo=True,
            dynamic_shapes=_dynamic_shapes(model, examples, batch),
            external_data=False,
            verbose=False,
        )
        assert program is not None  # dynamo=True always returns the program
        program.save(str(tmp_path))
        atomic_write_bytes(path, tmp_path.read_bytes())
    return path


def _dynamic_shapes(model: Any, examples: tuple[Any, ...], batch: Any) -> tuple[Any, ...]:
    """A dynamic batch axis for every input; a ``*inputs`` forward (the adapter of a keyword
    or dict forward) takes them as one tuple."""
    from paritygate.engines.torch_engine import ForwardAdapter

    axes = tuple({0: batch} for _ in examples)
    return (axes,) if isinstance(model, ForwardAdapter) else axes


def export_policy(
    config: Any,
    model: Any,
    report: Any,
    ckpt: Path,
    probes: Any,
    out: Path,
) -> Path:
    """Export the inference model the checks inspect (loaded, ``report`` its load) to
    ``out/policy.onnx`` with its manifest; the artifact path."""
    import torch

    spec = config.policy
    assert spec is not None
    if report.missing or report.shape_mismatch:
        raise InputError(
            ckpt,
            "state_dict",
            "cannot export: the inference model does not load "
            f"from the checkpoint (missing {report.missing[:3]}, shape "
            f"{[m[0] for m in report.shape_mismatch[:3]]})",
        )
    from paritygate.engines.torch_engine import ForwardAdapter

    names = spec.input_names
    rows = min(2, len(probes[names[0]]))
    example = tuple(torch.from_numpy(probes[n][:rows]) for n in names)
    exported = model.eval()
    if len(names) > 1 or spec.call != "positional":
        exported = ForwardAdapter(model, names, spec.call).eval()
    try:
        artifact = export_onnx(
            exported,
            example if len(names) > 1 else example[0],
            out / "policy.onnx",
            input_names=names,
            output_names=list(spec.output_names),
            opset=spec.opset,
        )
    except Exception as exc:
        raise InputError(
            config.path, "policy.inference_factory",
            f"the ONNX export of the inference model failed: "
            f"{_first_line(exc.__cause__ or exc)} (or give "
            "the artifact in policy.artifact)") from None
    write_manifest(artifact, ckpt, opset=spec.opset)
    return artifact


def _first_line(exc: BaseException) -> str:
    """An exception's type and first non-empty line, without terminal colour codes."""
    import re

    text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", str(exc))
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return f"{type(exc).__name__}: {line[:300]}"


def write_manifest(
    artifact: Path, checkpoint: Path, *, opset: int, extra: dict[str, Any] | None = None
) -> Path:
    """Write ``manifest.json`` beside ``artifact``."""
    from paritygate.provenance import environment, sha256_file

    manifest = {
        "artifact": artifact.name,
        "artifact_sha256": sha256_file(artifact),
        "checkpoint": os.path.relpath(checkpoint, artifact.parent),
        "checkpoint_sha256": sha256_file(checkpoint),
        "exporter": "torch.onnx.export(dynamo=True)",
        "opset": opset,
        "versions": environment(),
        **(extra or {}),
    }
    path = artifact.parent / "manifest.json"
    atomic_write_text(path, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return path


def read_manifest(path: Path) -> dict[str, Any] | None:
    from paritygate.reading import check_input

    if not path.exists():
        return None
    check_input(path, "policy.manifest", what="manifest")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # ValueError: JSON syntax and non-UTF-8 bytes
        raise InputError(path, "policy.manifest", f"manifest unreadable: {exc}") from None
    if not isinstance(data, dict):
        raise InputError(
            path, "policy.manifest", f"manifest is not a JSON object (got {type(data).__name__})"
        )
    return data


def match_initializers(
    weights: Any, state: dict[str, Any], model_state: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Which of the artifact's weight initializers are this checkpoint's tensors, in their place.

    ``weights``: the artifact's stored tensors as ``(name, float32 array, stored low-precision
    dtype or None)`` (:attr:`paritygate.engines.artifact_graph.ArtifactGraph.weights`: ONNX
    initializers, a TorchScript module's or an exported program's state).

    An initializer's *role* is the parameter it stands for: its name when that names a
    checkpoint tensor or a parameter of the inference model (``model_state``). With a
    role in the checkpoint it *matches* only that tensor (as stored or transposed); it is
    *folded* when it equals it up to one scale per output channel (a BatchNorm folded into
    the preceding Conv/Gemm; that layer's bias then differs too and counts as folded),
    *misplaced* when it equals another checkpoint tensor (a
    tensor exported into the wrong layer) and *drifted* when it has the role tensor's shape
    but other values (``max_rel_drift``: the largest |difference| / max |tensor|). Without
    a role it matches any checkpoint tensor of its value. A float16 or bfloat16 initializer (a
    precision-converted artifact) is compared with the checkpoint tensors cast to its dtype;
    ``converted`` counts those that match or fold, by dtype. ``not_in_model`` names matched
    initializers whose inference-model parameter of the same name holds other values (the
    checkpoint did not load into it). ``comparable`` counts initializers (floating point,
    2+ elements) with a checkpoint tensor of their shape. ``target_network`` maps each
    initializer whose values are found only under a target network's tensors
    (:func:`target_network`: ``q_net_target``, ``actor_target``, ``target_qf1``) to that
    tensor (``target_networks``: their names): an artifact built from a training-only copy of
    the policy, whatever the initializers are named; such an initializer is unmatched, never
    matched or misplaced.
    """
    import numpy as np

    named = _float_arrays(state)
    model = _float_arrays(model_state or {})
    by_shape: dict[tuple[int, ...], list[tuple[str, np.ndarray]]] = {}
    for name, arr in named.items():
        by_shape.setdefault(tuple(arr.shape), []).append((name, arr))
    matched: list[str] = []
    folded: list[str] = []
    unmatched: list[str] = []
    drifted: list[str] = []
    comparable = 0
    misplaced: dict[str, str] = {}
    not_in_model: list[str] = []
    rel: dict[str, float] = {}
    targets: dict[str, str] = {}
    low: dict[str, str] = {}  # initializer -> its float16/bfloat16 dtype
    for init_name, arr, stored in weights:
        pool = list(by_shape.get(tuple(arr.shape), []))
        if arr.ndim == 2:
            pool += [(n, t.T) for n, t in by_shape.get(tuple(arr.shape[::-1]), [])]
        if not pool:
            continue
        comparable += 1
        role = role_fp32 = named.get(init_name)
        rtol = 1e-5
        if stored is not None:  # compare with the checkpoint cast to the artifact's dtype
            pool = [(n, cast_rounded(t, stored)) for n, t in pool]
            role = None if role is None else cast_rounded(role, stored)
            rtol = 4 * UNIT_ROUNDOFF[stored]
        equal = [n for n, t in pool if np.array_equal(arr, t)]
        from_target = [n for n in equal if target_network(n)]
        if from_target and len(from_target) == len(equal) and np.ptp(arr) > 0:
            # only a target network holds these values (under any initializer name, its own
            # included): the artifact serves the training-only copy
            targets[init_name] = from_target[0]
            unmatched.append(init_name)
        elif role is None:  # no checkpoint tensor of this name: any of its value matches
            (matched if equal else unmatched).append(init_name)
        elif _same(arr, role):
            matched.append(init_name)
        elif _channel_scaled(arr, role_fp32, rtol):
            folded.append(init_name)
        elif equal and np.ptp(arr) > 0:  # a constant (all ones, zeros) places nothing
            misplaced[init_name] = equal[0]
            unmatched.append(init_name)
        else:
            unmatched.append(init_name)
            ref = role if role.shape == arr.shape else role.T
            if ref.shape == arr.shape:
                drifted.append(init_name)
                scale = float(np.abs(ref).max()) or 1.0
                rel[init_name] = float(np.abs(arr - ref).max()) / scale
        own = model.get(init_name)
        if stored is not None and own is not None:
            own = cast_rounded(own, stored)
        if init_name in matched and own is not None and not _same(arr, own):
            not_in_model.append(init_name)
        if stored is not None:
            low[init_name] = stored
    # A folded layer's bias absorbs the BatchNorm shift: folded with its weight.
    for name in [n for n in unmatched if n.endswith(".bias") and n not in misplaced]:
        if name[: -len("bias")] + "weight" in folded:
            unmatched.remove(name)
            folded.append(name)
    drifted = [n for n in drifted if n in unmatched]
    converted: dict[str, int] = {}
    for name in [*matched, *folded]:
        if name in low:
            converted[low[name]] = converted.get(low[name], 0) + 1
    return {
        "comparable": comparable,
        "matched": len(matched),
        "folded": len(folded),
        "unmatched": unmatched,
        "misplaced": misplaced,
        "drifted": drifted,
        "max_rel_drift": max((rel[n] for n in drifted), default=0.0),
        "not_in_model": not_in_model,
        "converted": converted,
        "target_network": targets,
        "target_networks": sorted({str(target_network(t)) for t in targets.values()}),
    }


def target_network(name: str) -> str | None:
    """The target-network part of a tensor name (``q_net_target``, ``actor_target``,
    ``critic_target``, CleanRL's ``target_network`` / ``qf1_target``, ``target_qf1``): a
    training-only copy of a network that the policy lags behind; ``None`` otherwise."""
    for part in name.split(".")[:-1]:
        low = part.lower()
        if low.endswith("_target") or low.startswith("target_") or low == "target":
            return part
    return None


@dataclass(frozen=True)
class ArtifactPrecision:
    """The precision an artifact stores its weights in, as declared and as found.

    ``converted`` counts, by dtype, the weight initializers that are checkpoint tensors cast
    to that dtype (:func:`match_initializers`); ``comparable`` is the number of initializers
    compared. The artifact *stores* a dtype when at least half of them are converted to it.
    """

    declared: str
    converted: Mapping[str, int]
    comparable: int

    @property
    def stored(self) -> str:
        if self.converted:
            dtype, n = max(self.converted.items(), key=lambda kv: kv[1])
            if n * 2 >= self.comparable:
                return dtype
        return "float32"

    @property
    def undeclared(self) -> bool:
        """A conversion the config does not declare (``policy.artifact_dtype``)."""
        return self.stored != self.declared

    def tier(self) -> tuple[str, dict[str, float]] | None:
        """The precision tier the artifact's outputs are judged by: training float32 against
        the declared dtype (``None`` for a float32 artifact: the fp32 defaults apply)."""
        from paritygate.metrics.tiers import tier_for

        return None if self.declared == "float32" else tier_for("float32", self.declared)

    def share(self) -> str:
        return f"{self.converted.get(self.stored, 0)}/{self.comparable}"


def artifact_limits(
    precision: ArtifactPrecision,
    thresholds: Mapping[str, float | None],
    fp32_keys: Sequence[str],
    overrides: Collection[str] = (),
    *,
    gaussian: bool = False,
) -> tuple[dict[str, float | None], str | None]:
    """``thresholds`` for the artifact's declared precision, and a note naming the tier
    (``None`` for a float32 artifact): :func:`paritygate.metrics.tiers.judged_limits`, the
    rule every served-copy comparison uses. The fp32 torch-vs-ONNX limits named in
    ``fp32_keys`` take the tier's ``max_abs_diff``; ``logits_agreement``'s distribution limits
    (and, with ``gaussian``, a Gaussian policy's) take the tier's own; names in ``overrides``
    (set in the config) keep their value."""
    from paritygate.metrics.tiers import judged_limits

    categorical = ("kl_max", "tv_max", "argmax_disagreement", "topk_overlap_min")
    gaussian_keys = ("action_max_abs_diff", "std_max_abs_diff", "gaussian_kl_max",
                     "logprob_delta_max_abs")
    judged = [*fp32_keys, *categorical, *(gaussian_keys if gaussian else ())]
    limits = judged_limits(
        precision.tier(), dict(thresholds), overrides, names=judged,
        aliases={name: "max_abs_diff" for name in fp32_keys},
        declared_by=f"policy.artifact_dtype {precision.declared}",
    )
    shown = [*fp32_keys, *(gaussian_keys if gaussian else ("kl_max", "tv_max"))]
    return dict(limits), limits.note([n for n in shown if n in thresholds])


LOW_PRECISION_INITIALIZERS = {10: "float16", 16: "bfloat16"}
UNIT_ROUNDOFF = {"float16": 2.0**-11, "bfloat16": 2.0**-8}
"""ONNX ``TensorProto`` data types of a precision-converted artifact's weights (FLOAT16,
BFLOAT16), by the dtype name the config declares."""


def cast_rounded(array: Any, dtype: str) -> Any:
    """``array`` (float32) rounded to ``dtype`` as a conversion tool stores it, back in float32:
    the checkpoint tensor a converted initializer must equal."""
    import torch

    return torch.from_numpy(array).to(getattr(torch, dtype)).float().numpy()


def _float_arrays(state: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for name, t in state.items():
        if getattr(t, "is_floating_point", lambda: False)() and t.numel() >= 2:
            out[name] = t.detach().float().cpu().numpy()
    return out


def _same(arr: Any, ref: Any) -> bool:
    """Equal as stored, or transposed (a 2-D weight stored for Gemm/MatMul)."""
    import numpy as np

    if arr.shape == ref.shape and np.array_equal(arr, ref):
        return True
    return arr.ndim == 2 and arr.shape == ref.shape[::-1] and np.array_equal(arr, ref.T)


def _channel_scaled(arr: Any, ref: Any, rtol: float = 1e-5) -> bool:
    """``arr == ref * s`` with one scale ``s`` per output channel (axis 0), ``ref.ndim >= 2``,
    to ``rtol`` of each channel's largest value."""
    import numpy as np

    if arr.shape != ref.shape or ref.ndim < 2:
        return False
    a, r = arr.reshape(len(arr), -1).astype(np.float64), ref.reshape(len(ref), -1)
    norm = (r * r).sum(1)
    if np.any(norm == 0):
        return False
    scale = (a * r).sum(1) / norm  # least-squares per-channel scale
    resid = np.abs(a - scale[:, None] * r).max(1)
    return bool(np.all(resid <= rtol * np.maximum(np.abs(a).max(1), 1e-12)))
