"""Reference engine: a torch module in eval mode, fp32, no autograd."""

from __future__ import annotations

from collections.abc import Mapping
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


class TorchEngine:
    """Runs ``module`` on the feed named ``input_name``; returns ``{output_name: array}``."""

    def __init__(
        self,
        module: torch.nn.Module,
        *,
        input_name: str,
        output_name: str,
        select: str | int = 0,
        name: str = "torch",
    ) -> None:
        self.module = module
        self.input_name = input_name
        self.output_name = output_name
        self.select = select
        self.name = name

    def infer(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = torch.from_numpy(np.ascontiguousarray(feeds[self.input_name]))
        with torch.inference_mode():
            out = select_output(self.module(x), self.select)
        return {self.output_name: out.detach().float().cpu().numpy()}
