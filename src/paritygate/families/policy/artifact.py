"""The candidate: an engine over the artifact in its format (ONNX, TorchScript or a
torch.export program), its inputs and policy output validated against the spec and feeds."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from paritygate.errors import InputError, keyed
from paritygate.families.policy.validation import check_artifact_inputs, check_input_dtypes

if TYPE_CHECKING:
    from paritygate.config.policy import PolicySpec
    from paritygate.engines.artifact_graph import ArtifactGraph
    from paritygate.engines.torch_export_engine import TorchExportEngine
    from paritygate.engines.torchscript_engine import TorchScriptEngine


class ArtifactEngine(Protocol):
    """An engine over an artifact file: its path, its graph as the checks read it, and the
    name-keyed forward (``infer`` splits at a fixed batch axis, ``run_batch`` does not)."""

    name: str

    @property
    def path(self) -> Path: ...
    @property
    def graph(self) -> ArtifactGraph: ...
    def infer(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...
    def run_batch(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...


def artifact_format(given: Path | None, spec: PolicySpec) -> str:
    """``onnx``, ``torchscript`` or ``torch_export``: the format the artifact is read as
    (an artifact exported on the fly, ``given`` ``None``, is ONNX)."""
    if given is None:
        return "onnx"
    from paritygate.engines.artifact_graph import sniff_format

    return spec.artifact_format or sniff_format(given) or "onnx"


def open_artifact(artifact: Path, spec: PolicySpec, feeds: Mapping[str, np.ndarray], *,
                  allow_pickle: bool = False) -> ArtifactEngine:
    """An engine over ``artifact`` in its format (``policy.artifact_format``, else told by
    the file), its inputs and policy output validated."""
    from paritygate.engines.artifact_graph import FORMATS_TEXT, sniff_format

    fmt = spec.artifact_format or sniff_format(artifact)
    if fmt in ("torchscript", "torch_export"):
        return open_torch_artifact(artifact, fmt, spec, feeds, allow_pickle)
    from paritygate.engines.onnxruntime_engine import OnnxRuntimeEngine

    if fmt == "onnx":
        with keyed("policy.artifact"):
            candidate = OnnxRuntimeEngine(artifact)
    else:
        try:
            candidate = OnnxRuntimeEngine(artifact)
        except InputError:
            raise InputError(artifact, "policy.artifact",
                             f"not an artifact the gate reads: the gate reads {FORMATS_TEXT} "
                             "(set policy.artifact_format to name one)") from None
    names = candidate.input_names
    absent = [n for n in spec.input_names if n not in names]
    if len(spec.input_names) > 1 and absent:
        raise InputError(
            artifact, "inputs", f"artifact inputs {names} do not include {absent} "
            f"(policy.inputs declares {spec.input_names})")
    check_artifact_inputs(
        candidate.session, artifact, spec.input_names[0], feeds[spec.input_names[0]],
        spec.output_names[0]
    )
    for name in spec.input_names[1:]:
        check_artifact_inputs(candidate.session, artifact, name, feeds[name])
    check_input_dtypes(candidate.session, artifact, spec, feeds)
    return candidate


def open_torch_artifact(artifact: Path, fmt: str, spec: PolicySpec,
                        feeds: Mapping[str, np.ndarray], allow_pickle: bool) -> ArtifactEngine:
    """A TorchScript or torch.export engine over ``artifact``: its input count must be the
    declared inputs' and it must run two probe rows, returning the policy output in the
    probes' batch (the first declared output: these formats name outputs by position)."""
    from paritygate.engines.torchscript_engine import TorchScriptEngine

    names = spec.input_names
    if fmt == "torchscript":
        candidate: TorchScriptEngine | TorchExportEngine = TorchScriptEngine(
            artifact, input_names=names, output_names=spec.output_names, call=spec.call)
    else:
        from paritygate.engines.torch_export_engine import TorchExportEngine

        candidate = TorchExportEngine(artifact, input_names=names,
                                      output_names=spec.output_names, call=spec.call,
                                      allow_pickle=allow_pickle)
    n_inputs = len(candidate.graph.input_names)
    if n_inputs != len(names):
        raise InputError(artifact, "policy.inputs",
                         f"the {fmt} artifact takes {n_inputs} input(s); policy.inputs declares "
                         f"{len(names)} ({names})")
    rows = {n: v[:2] for n, v in feeds.items()}
    if isinstance(candidate, TorchScriptEngine) and len(next(iter(rows.values()))) > 1:
        candidate.find_fixed_batch(feeds)
    if candidate.fixed_batch:
        rows = {n: np.repeat(v[:1], candidate.fixed_batch, axis=0) for n, v in feeds.items()}
    try:
        out = candidate.infer(rows)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        raise InputError(artifact, "policy.artifact",
                         f"the {fmt} artifact does not run on two probe rows: "
                         f"{type(exc).__name__}: {first}") from None
    policy = out.get(spec.output_names[0])
    if policy is None or policy.ndim == 0 or len(policy) != len(next(iter(rows.values()))):
        raise InputError(artifact, "policy.output_names",
                         f"the {fmt} artifact's first output is not a batch of policy outputs")
    candidate.graph.output_names = list(out)  # named by position: what it returns
    return candidate
