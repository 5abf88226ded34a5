"""Builders of the Dict-observation and recurrent fault zoo (``policy_zoo.SHAPE_FAULTS``).

A builder ``build(clean_dir, out_dir)`` reads a clean subject built by
``paritygate.demo.shapes`` (``build_dict`` / ``build_recurrent``), writes the faulty
artifact or probes into ``out_dir`` and returns the config overrides that point the
subject's gate at them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

Overrides = dict[str, Any]
Builder = Callable[[Path, Path], Overrides]
SHAPES = "paritygate.demo.shapes"


def _inference_state(clean: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    state = load_file(str(clean / "policy.safetensors"))
    return {k: v for k, v in state.items() if not k.startswith("value_head.")}


def _export(clean: Path, out: Path, module: torch.nn.Module, order: list[str],
            names: list[str], outputs: list[str], examples: dict[str, Any],
            state: dict[str, Any] | None = None) -> Overrides:
    """Export ``module`` (the clean inference weights loaded) taking the inputs ``order``
    positionally, its ONNX inputs named ``names``; a manifest for the clean checkpoint."""
    from paritygate.engines.torch_engine import ForwardAdapter
    from paritygate.families.policy.export import export_onnx, write_manifest

    out.mkdir(parents=True, exist_ok=True)
    module.load_state_dict(state if state is not None else _inference_state(clean), strict=True)
    adapter = ForwardAdapter(module.eval(), order, "positional").eval()
    artifact = export_onnx(adapter, tuple(examples[n] for n in order), out / "policy.onnx",
                           input_names=names, output_names=outputs)
    write_manifest(artifact, clean / "policy.safetensors", opset=18)
    return {"policy": {"artifact": str(artifact)}}


def serving(input_index: int, fn: str) -> Builder:
    """Another serving preprocessing for one input of the Dict demo."""

    def build(clean: Path, out: Path) -> Overrides:
        from paritygate.demo.shapes import dict_config

        inputs = dict_config(clean)["policy"]["inputs"]
        inputs[input_index]["preprocessing"]["serving"] = f"paritygate.demo.faults:{fn}"
        for spec in inputs:
            stats = spec.get("preprocessing", {}).get("stats")
            if stats:
                spec["preprocessing"]["stats"] = str(clean / stats)
        return {"policy": {"inputs": inputs}}

    return build


def dict_inputs_swapped(clean: Path, out: Path) -> Overrides:
    """The export wires the ONNX input ``vector`` into the model's ``goal`` and back (the
    inputs keep their declared names and order)."""
    from paritygate.demo.shapes import GOAL_DIM, IMAGE_SHAPE, VECTOR_DIM, MultiInputPolicy

    class Crosswise(MultiInputPolicy):
        def forward(self, image: Any, vector: Any, goal: Any) -> Any:  # type: ignore[override]
            return super().forward({"image": image, "vector": goal, "goal": vector})

    examples = {"image": torch.zeros(2, *IMAGE_SHAPE), "vector": torch.zeros(2, VECTOR_DIM),
                "goal": torch.zeros(2, GOAL_DIM)}
    names = ["image", "vector", "goal"]
    return _export(clean, out, Crosswise(value_head=False), names, names, ["logits"], examples)


def npz_probes(clean: Path, out: Path) -> Overrides:
    """The Dict demo's probes from an ``.npz`` with one array per key."""
    from paritygate.demo.shapes import dict_probes

    out.mkdir(parents=True, exist_ok=True)
    path = out / "probes.npz"
    np.savez(path, **dict_probes(24, 7))
    return {"policy": {"probes": {"file": str(path), "generator": None}}}


def keyword_call(clean: Path, out: Path) -> Overrides:
    """The Dict demo with forwards taking each key as a keyword argument."""
    return {"policy": {"call": "keyword",
                       "training_factory": f"{SHAPES}:build_keyword_training",
                       "inference_factory": f"{SHAPES}:build_keyword_inference"}}


# --- recurrent -----------------------------------------------------------------------------------


def _recurrent_examples() -> dict[str, Any]:
    from paritygate.demo.shapes import HIDDEN, OBS_DIM

    return {"obs": torch.zeros(2, OBS_DIM), "h_in": torch.zeros(2, HIDDEN),
            "c_in": torch.zeros(2, HIDDEN), "episode_start": torch.zeros(2)}


def recurrent_artifact(variant: Callable[[], torch.nn.Module]) -> Builder:
    """An artifact exported from a faulty serving variant of the LSTM actor."""

    def build(clean: Path, out: Path) -> Overrides:
        names = ["obs", "h_in", "c_in", "episode_start"]
        return _export(clean, out, variant(), names, names, ["logits", "h_out", "c_out"],
                       _recurrent_examples())

    return build


def _lstm() -> Any:
    from paritygate.demo.shapes import LSTMPolicy

    return LSTMPolicy


def zero_reset() -> torch.nn.Module:
    """Resets to zeros instead of the learned initial state (the export wrapper's own init)."""

    class ZeroReset(_lstm()):  # type: ignore[misc]
        def reset(self, h: Any, c: Any, episode_start: Any) -> Any:
            keep = (1 - episode_start).unsqueeze(-1)
            return keep * h, keep * c

    return ZeroReset(value_head=False)


def no_reset() -> torch.nn.Module:
    """Ignores its episode-start input: the state runs on across episodes."""

    class NoReset(_lstm()):  # type: ignore[misc]
        def reset(self, h: Any, c: Any, episode_start: Any) -> Any:
            return h + 0 * episode_start.unsqueeze(-1), c

    return NoReset(value_head=False)


def swapped_states() -> torch.nn.Module:
    """Returns ``(logits, c, h)`` under the names ``(logits, h_out, c_out)``."""

    class Swapped(_lstm()):  # type: ignore[misc]
        def forward(self, obs: Any, h: Any, c: Any, episode_start: Any) -> Any:
            logits, h, c = super().forward(obs, h, c, episode_start)
            return logits, c, h

    return Swapped(value_head=False)


def layered_state() -> torch.nn.Module:
    """Returns ``h`` in torch.nn.LSTM's (num_layers, batch, hidden) layout."""

    class Layered(_lstm()):  # type: ignore[misc]
        def forward(self, obs: Any, h: Any, c: Any, episode_start: Any) -> Any:
            logits, h, c = super().forward(obs, h, c, episode_start)
            return logits, h.unsqueeze(0), c

    return Layered(value_head=False)


def recurrent_stale(clean: Path, out: Path) -> Overrides:
    """The LSTM actor exported from weights 1e-3 relative away, without a manifest."""
    import os

    from paritygate.demo.shapes import LSTMPolicy

    module = LSTMPolicy(value_head=False)
    state = _inference_state(clean)
    gen = torch.Generator().manual_seed(1)
    moved = {k: v + 1e-3 * v.abs().max() * torch.randn(v.shape, generator=gen)
             for k, v in state.items()}
    names = ["obs", "h_in", "c_in", "episode_start"]
    overrides = _export(clean, out, module, names, names, ["logits", "h_out", "c_out"],
                        _recurrent_examples(), state=moved)
    os.remove(out / "manifest.json")
    return overrides


def gate_reset(clean: Path, out: Path) -> Overrides:
    """The LSTM actor without an episode-start input: the gate resets the state."""
    names = ["obs", "h_in", "c_in"]
    from paritygate.demo.shapes import GateResetLSTMPolicy

    overrides = _export(clean, out, GateResetLSTMPolicy(value_head=False), names, names,
                        ["logits", "h_out", "c_out"], _recurrent_examples())
    overrides["policy"].update({
        "training_factory": f"{SHAPES}:build_gate_reset_training",
        "inference_factory": f"{SHAPES}:build_gate_reset_inference",
        "inputs": names,
        "recurrent": {"episode_start": None},
    })
    return overrides
