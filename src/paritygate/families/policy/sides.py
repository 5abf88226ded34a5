"""The two sides of a policy gate as engines: the reference (the training model, the training
path) and the heads-removed torch model the artifact is exported from.

Each helper takes the spec and the model it wraps, never the family context.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import numpy as np

from paritygate.errors import InputError
from paritygate.families.policy.distribution import deterministic_action
from paritygate.imports import import_callable

if TYPE_CHECKING:
    from torch import nn

    from paritygate.config import GateConfig
    from paritygate.config.policy import PolicySpec
    from paritygate.engines.torch_engine import TorchEngine

REFERENCE_LOG_STD = "log_std (training output)"
"""The reference engine's label for a distribution's log-std output (no output is named so)."""


def reference_state_outputs(spec: PolicySpec) -> dict[str, str | int] | None:
    """The training forward's element holding each recurrent state output."""
    if spec.recurrent is None:
        return None
    return {s.output: (s.training_output if s.training_output is not None
                       else spec.output_names.index(s.output))
            for s in spec.recurrent.states}


def reference_extra_outputs(spec: PolicySpec) -> dict[str, str | int]:
    """What the reference engine selects besides the policy output: each recurrent state
    output and, with ``distribution.log_std: output``, the log-std (:data:`REFERENCE_LOG_STD`)."""
    extra = dict(reference_state_outputs(spec) or {})
    dist = spec.gaussian
    if dist is not None and dist.log_std == "output":
        extra[REFERENCE_LOG_STD] = dist.log_std_key
    return extra


def reference_engine(model: nn.Module, spec: PolicySpec, name: str, *,
                     extras: bool = False) -> TorchEngine:
    """A training torch model as an engine: its policy output and, with ``extras``, the
    outputs of :func:`reference_extra_outputs`."""
    from paritygate.engines.torch_engine import TorchEngine

    return TorchEngine(model, input_names=spec.input_names, call=spec.call,
                       output_name=spec.output_names[0], select=spec.policy_output,
                       extra_outputs=reference_extra_outputs(spec) if extras else None,
                       name=name)


def heads_removed_engine(model: nn.Module, spec: PolicySpec, name: str) -> TorchEngine:
    """A heads-removed (serving) torch model as an engine: outputs in ``output_names``
    order."""
    from paritygate.engines.torch_engine import TorchEngine

    extra = {o: i for i, o in enumerate(spec.output_names) if i}
    return TorchEngine(model, input_names=spec.input_names, call=spec.call,
                       output_name=spec.output_names[0], select=0,
                       extra_outputs=extra if spec.recurrent else None, name=name)


def declared_outputs(model: nn.Module, spec: PolicySpec, feeds: Mapping[str, np.ndarray]
                     ) -> dict[str, np.ndarray | None]:
    """A torch model's output for each declared output after the first, on ``feeds``: the
    element of the same position in its result (the dict key of that name, else the tuple
    index); ``None`` where its result has no such element."""
    import torch

    from paritygate.engines.torch_engine import call_forward

    names = spec.input_names
    tensors = {n: torch.from_numpy(np.ascontiguousarray(feeds[n])) for n in names}
    with torch.inference_mode():
        result = call_forward(model, tensors, names, spec.call)
    out: dict[str, np.ndarray | None] = {}
    for index, name in enumerate(spec.output_names[1:], start=1):
        value: object = None
        if isinstance(result, Mapping):
            value = result.get(name)
            if value is None and len(result) > index and all(
                    k not in result for k in spec.output_names):
                value = list(result.values())[index]
        elif isinstance(result, (tuple, list)) and len(result) > index:
            value = result[index]
        out[name] = (value.detach().float().cpu().numpy()
                     if isinstance(value, torch.Tensor) else None)
    return out


def serves_action(spec: PolicySpec) -> bool:
    """Whether the artifact serves the env action (``distribution.serving_output: action``)."""
    dist = spec.distribution
    return dist is not None and dist.serving_output == "action"


def as_served(spec: PolicySpec, reference_output: np.ndarray) -> np.ndarray:
    """A training policy output in the artifact's terms: itself, or its deterministic env
    action when the artifact serves actions (``distribution.serving_output: action``)."""
    if not serves_action(spec):
        return reference_output
    return deterministic_action(spec, reference_output).astype(reference_output.dtype)


def nearer_to_served(raw: np.ndarray, served: np.ndarray, heads_removed: np.ndarray) -> bool:
    """Whether the heads-removed model's output is nearer the served action than the raw
    training output (its factory applies the action transform itself)."""
    if heads_removed.shape != raw.shape:
        return True  # no raw comparison possible: judge it as served, the shapes will say

    def gap(reference: np.ndarray) -> float:
        with np.errstate(invalid="ignore"):
            return float(np.nanmax(np.abs(reference.astype(np.float64)
                                          - heads_removed.astype(np.float64)), initial=0.0))

    return gap(served) < gap(raw)


def factory_kwargs(config: GateConfig, spec: PolicySpec) -> dict[str, object]:
    """``factory_kwargs`` with the ``factory_path_kwargs`` resolved relative to the config."""
    kwargs = dict(spec.factory_kwargs)
    for name in spec.factory_path_kwargs:
        kwargs[name] = str(config.resolve(kwargs[name]))
    return kwargs


def build_model(factory_spec: str, key: str, config: GateConfig, spec: PolicySpec) -> nn.Module:
    """The model ``factory_spec`` builds (``key`` names it in bad-input errors)."""
    factory: Callable[..., object] = import_callable(factory_spec, config.path, key)
    try:
        model = factory(**factory_kwargs(config, spec))
    except Exception as exc:
        raise InputError(config.path, key, f"factory failed: {type(exc).__name__}: {exc}") from None
    if not hasattr(model, "state_dict"):
        raise InputError(config.path, key, "factory did not return a torch.nn.Module")
    return model  # type: ignore[return-value]  # a module by duck type; torch is not imported
