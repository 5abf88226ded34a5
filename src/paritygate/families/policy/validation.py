"""Bad input found before any check runs (exit code 2, one line naming the file and key):
the files' sizes, how the forwards take their inputs, what the policy output key picks, and
whether an artifact's inputs take the probes.

Each function takes the spec and what it validates, never the family context.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from paritygate.errors import InputError, keyed
from paritygate.families.policy.sides import REFERENCE_LOG_STD, reference_extra_outputs

if TYPE_CHECKING:
    from torch import nn

    from paritygate.config import GateConfig
    from paritygate.config.policy import PolicySpec


class OrtArg(Protocol):
    """An ONNX Runtime session's input or output description."""

    @property
    def name(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def shape(self) -> Sequence[int | str | None]: ...


class OrtSession(Protocol):
    """What the checks read of an ONNX Runtime ``InferenceSession``."""

    def get_inputs(self) -> Sequence[OrtArg]: ...
    def get_outputs(self) -> Sequence[OrtArg]: ...


def check_files(config: GateConfig, spec: PolicySpec) -> None:
    """The checkpoint, the probe file and each initial-state file may be read, and are within
    their size bounds (:mod:`paritygate.reading`; a zip checkpoint's members too): judged
    from ``stat``, zip directories and headers before torch is imported, so a sparse
    checkpoint or a zip bomb is refused in about a second."""
    from paritygate.checkpoints import memory_bytes
    from paritygate.reading import check_array_file, check_input, check_zip_members

    with keyed("policy.checkpoint"):
        ckpt = check_input(spec.checkpoint, None, what="checkpoint")
        # an SB3 zip or a torch zip file: its members' declared sizes (torch stores them)
        check_zip_members(ckpt, None, what="member", max_bytes=memory_bytes())
    if spec.probes.file is not None:
        check_array_file(spec.probes.file, "policy.probes.file",
                         what="probe file")
    for i, state in enumerate(spec.recurrent.states if spec.recurrent else []):
        if isinstance(state.initial, Path):
            check_array_file(state.initial,
                             f"policy.recurrent.states[{i}].initial", what="initial state")
    if spec.artifact is not None and spec.artifact.exists():
        with keyed("policy.artifact"):  # a TorchScript or .pt2 zip: no member a zip bomb
            artifact = check_input(spec.artifact, None, what="artifact")
            check_zip_members(artifact, None, what="member", max_bytes=memory_bytes())
    if spec.serving_log is not None:
        from paritygate.families.policy.serving_log import scan_serving_log

        with keyed("policy.serving_log"):
            scan_serving_log(check_input(spec.serving_log.path, None,
                                         what="serving log"), spec.serving_log.max_records)


def check_forward_call(config: GateConfig, spec: PolicySpec, model: nn.Module, side: str) -> None:
    """The forward must accept the inputs as the gate feeds them (``policy.inputs`` /
    ``policy.call``): a mismatch is bad input, named, before any check runs."""
    import inspect

    try:
        signature = inspect.signature(model.forward)
    except (TypeError, ValueError):  # a builtin or C forward: nothing to bind against
        return
    names = spec.input_names
    try:
        if spec.call == "dict":
            signature.bind({n: None for n in names})
        elif spec.call == "keyword":
            signature.bind(**dict.fromkeys(names))
        else:
            signature.bind(*names)
    except TypeError:
        key = "policy.inputs" if spec.inputs is None else "policy.call"
        fix = ("declare the inputs in policy.inputs" if spec.inputs is None
               else "declare how the forward takes them in policy.call (positional, keyword "
                    "or dict) and the inputs in order in policy.inputs")
        raise InputError(
            config.path, key,
            f"the {side} forward takes {_takes(model.forward)} but the gate feeds "
            f"{_fed(spec)}; {fix}") from None


def _describe(output: object) -> str:
    if isinstance(output, (tuple, list)):
        return f"a {type(output).__name__} of {len(output)}"
    if hasattr(output, "keys"):
        return f"a {type(output).__name__} with keys {list(output.keys())}"
    return f"a {type(output).__name__}"


def _fed(spec: PolicySpec) -> str:
    """How the gate calls a forward, in words."""
    names = spec.input_names
    ticks = ", ".join(f"`{n}`" for n in names)
    if spec.call == "dict":
        return f"one dict with keys {ticks}"
    if spec.call == "keyword":
        return f"the keyword arguments {ticks}"
    return f"one tensor {ticks}" if len(names) == 1 else f"{len(names)} tensors {ticks}"


def _takes(forward: Callable[..., object]) -> str:
    """What a forward's signature takes, in words."""
    import inspect

    params = list(inspect.signature(forward).parameters.values())
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY,
                                                       p.POSITIONAL_OR_KEYWORD)]
    required = [p.name for p in params if p.default is p.empty
                and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    n = len(positional)
    text = f"{n} positional argument{'s' if n != 1 else ''} ({', '.join(positional)})"
    if set(required) - set(positional):
        text += f" and the keyword arguments {sorted(set(required) - set(positional))}"
    return text


def check_policy_output(config: GateConfig, spec: PolicySpec, model: nn.Module,
                        feeds: Mapping[str, np.ndarray]) -> None:
    """``policy.policy_output``, each recurrent state's ``training_output`` and a Gaussian's
    ``log_std_key`` must pick tensors out of the training forward's result (two probe rows)."""
    import torch

    from paritygate.engines.torch_engine import call_forward, select_output

    names = spec.input_names
    tensors = {n: torch.from_numpy(np.ascontiguousarray(feeds[n][:2])) for n in names}
    with torch.random.fork_rng(devices=[]), torch.inference_mode():
        try:
            output = call_forward(model, tensors, names, spec.call)
        except Exception:  # a forward that fails is the checks' to report
            return
        try:
            picked = select_output(output, spec.policy_output)
        except (KeyError, IndexError, TypeError, AttributeError):
            picked = None
        for key, which in reference_extra_outputs(spec).items():
            try:
                state = select_output(output, which)
            except (KeyError, IndexError, TypeError, AttributeError):
                state = None
            if key == REFERENCE_LOG_STD:
                if not isinstance(state, torch.Tensor) or isinstance(output, torch.Tensor):
                    raise InputError(config.path, "policy.distribution.log_std_key",
                                     f"{which!r} does not pick log_std out of the training "
                                     "forward's result")
            elif not isinstance(state, torch.Tensor):
                index = spec.state_output_names.index(key)
                raise InputError(
                    config.path, f"policy.recurrent.states[{index}].training_output",
                    f"{which!r} does not pick the state {key!r} out of the training forward's "
                    f"result: it returns {_describe(output)}")
    if not isinstance(picked, torch.Tensor):
        raise InputError(
            config.path,
            "policy.policy_output",
            f"{spec.policy_output!r} does not pick a tensor: the training forward returns "
            f"{_describe(output)}",
        )


def check_artifact_inputs(
    session: OrtSession,
    ctx_artifact: Path,
    input_name: str,
    probes: np.ndarray,
    output_name: str | None = None,
) -> None:
    """The artifact's input ``input_name`` must have the probes' feature shape;
    ``output_name`` (the declared policy output), when given, must be one of its outputs."""
    outputs = [o.name for o in session.get_outputs()]
    if output_name is not None and output_name not in outputs:
        raise InputError(
            ctx_artifact,
            "policy.output_names",
            f"artifact has no output {output_name!r} (its outputs: {outputs})",
        )
    inputs = session.get_inputs()
    names = [i.name for i in inputs]
    if input_name not in names:
        raise InputError(
            ctx_artifact, "inputs", f"artifact inputs {names} do not include {input_name!r}"
        )
    shape = next(i.shape for i in inputs if i.name == input_name)
    if len(shape) != probes.ndim:
        raise InputError(
            ctx_artifact,
            f"inputs.{input_name}",
            f"rank {len(shape)} does not match the probes' rank {probes.ndim}",
        )
    for axis, (dim, want) in enumerate(zip(shape[1:], probes.shape[1:], strict=False), start=1):
        if isinstance(dim, int) and dim != want:
            raise InputError(
                ctx_artifact,
                f"inputs.{input_name}",
                f"axis {axis} is {dim} but the model input has {want}",
            )


_ORT_DTYPES = {"tensor(float)": "float32", "tensor(double)": "float64",
               "tensor(float16)": "float16", "tensor(uint8)": "uint8", "tensor(int8)": "int8",
               "tensor(int16)": "int16", "tensor(int32)": "int32", "tensor(int64)": "int64",
               "tensor(bool)": "bool", "tensor(uint16)": "uint16", "tensor(uint32)": "uint32",
               "tensor(uint64)": "uint64"}
"""ONNX Runtime's input type names, as numpy dtype names."""


def check_input_dtypes(session: OrtSession, artifact: Path, spec: PolicySpec,
                       feeds: Mapping[str, np.ndarray]) -> None:
    """Every artifact input must take the dtype the gate feeds it (the probes as loaded, or
    the training preprocessing's output): uint8 image probes fed to a float32 artifact are bad
    input, named with both keys and both dtypes before any check runs."""
    for spec_input in session.get_inputs():
        fed = feeds.get(spec_input.name)
        want = _ORT_DTYPES.get(spec_input.type)
        if fed is None or want is None or np.dtype(want) == fed.dtype:
            continue
        name = spec_input.name
        observation = name in {i.name for i in spec.observation_inputs}
        pre = spec.input_preprocessing(name) if observation else None
        if not observation:
            source = f"the gate's recurrent input {name!r} ({fed.dtype})"
        elif pre is not None:
            source = (f"{spec.preprocessing_key(name)}.training gives {fed.dtype} for input "
                      f"{name!r}")
        else:
            source = f"policy.probes are {fed.dtype} for input {name!r}"
        raise InputError(
            artifact, "policy.artifact",
            f"input {name!r} takes {want}, but {source}: feed the artifact's dtype (save the "
            f"probes as {want}, or export the artifact with a {fed.dtype} input)")
