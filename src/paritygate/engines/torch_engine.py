"""Reference engine: a torch module in eval mode, fp32, no autograd."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch


def select_output(output: Any, which: str | int) -> torch.Tensor:
    """Pick the policy tensor out of a forward's result (tensor, tuple/list, dict, dataclass)."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, Mapping) or hasattr(output, "keys"):
        if isinstance(which, int):
            return list(output.values())[which]
        return output[which]
    if isinstance(output, (tuple, list)):
        if isinstance(which, str):
            raise KeyError(
                f"forward returned a {type(output).__name__}; policy_output must be an index"
            )
        return output[which]
    if isinstance(which, str) and hasattr(output, which):
        return getattr(output, which)
    raise TypeError(f"cannot select policy output from {type(output).__name__}")


def call_forward(
    module: Callable[..., object], tensors: Mapping[str, torch.Tensor], names: Sequence[str],
    call: str = "positional",
) -> object:
    """``module`` called on the named inputs as declared: ``positional`` ``module(a, b)``,
    ``keyword`` ``module(a=..., b=...)`` or ``dict`` ``module({"a": ..., "b": ...})``."""
    if call == "dict":
        return module({n: tensors[n] for n in names})
    if call == "keyword":
        return module(**{n: tensors[n] for n in names})
    return module(*(tensors[n] for n in names))


class ForwardAdapter(torch.nn.Module):
    """Positional inputs in declared order, passed to ``module`` as ``call`` declares (the
    exporter's view of a keyword or dict forward)."""

    def __init__(self, module: torch.nn.Module, names: Sequence[str], call: str) -> None:
        super().__init__()
        self.module = module
        self.names = list(names)
        self.call = call

    def forward(self, *inputs: torch.Tensor) -> object:
        return call_forward(self.module, dict(zip(self.names, inputs, strict=True)), self.names,
                            self.call)


class TorchEngine:
    """Runs ``module`` on the feeds named ``input_names`` (called as ``call`` declares); returns
    ``{output_name: array}`` and, with ``extra_outputs`` (name -> element of the result), those
    outputs too."""

    def __init__(
        self,
        module: torch.nn.Module,
        *,
        input_name: str | None = None,
        output_name: str,
        select: str | int = 0,
        name: str = "torch",
        input_names: Sequence[str] | None = None,
        call: str = "positional",
        extra_outputs: Mapping[str, str | int] | None = None,
    ) -> None:
        self.module = module
        self.input_names = list(input_names or [input_name or "obs"])
        self.input_name = self.input_names[0]
        self.output_name = output_name
        self.select = select
        self.name = name
        self.call = call
        self.extra_outputs = dict(extra_outputs or {})

    def infer(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        tensors = {n: torch.from_numpy(np.ascontiguousarray(feeds[n])) for n in self.input_names}
        with torch.inference_mode():
            result = call_forward(self.module, tensors, self.input_names, self.call)
            out = {self.output_name: select_output(result, self.select)}
            for label, which in self.extra_outputs.items():
                out[label] = select_output(result, which)
        return {k: v.detach().float().cpu().numpy() for k, v in out.items()}
