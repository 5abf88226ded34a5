"""A policy that normalises its own observations (a mean/variance module inside the model, as
``RunningMeanStd`` wrappers do), shipped as TorchScript and as a ``.pt2`` program: correctly, and
exported from a forward that skips the normaliser (its buffers stored in the artifact, unused).

The faulty artifacts must fail ``logits_agreement`` with ``normaliser_missing`` (the root cause
of the other failures), their clean twins pass."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

OBS_DIM, ACTIONS = 6, 3


class ObsNormaliser(nn.Module):
    """``clip((obs - mean) / sqrt(var + eps))``: running statistics as buffers."""

    def __init__(self, dim: int = OBS_DIM) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("var", torch.ones(dim))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return ((obs - self.mean) / torch.sqrt(self.var + 1e-8)).clamp(-10.0, 10.0)


class NormalisedActor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.obs_rms = ObsNormaliser()
        self.net = nn.Sequential(nn.Linear(OBS_DIM, 32), nn.Tanh(), nn.Linear(32, ACTIONS))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(self.obs_rms(obs))


class NormalisedAgent(NormalisedActor):
    """The training model: the actor and a value head."""

    def __init__(self) -> None:
        super().__init__()
        self.value_head = nn.Linear(OBS_DIM, 1)

    def forward(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:  # type: ignore[override]
        z = self.obs_rms(obs)
        return {"logits": self.net(z), "value": self.value_head(z)}


class SkipsNormaliser(NormalisedActor):
    """The export mistake: the normaliser is stored but its forward skips it."""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs)


class BatchOne(nn.Module):
    """A trace that reads the batch size as a Python int: traced on one row, it is fixed to 1."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.inner(obs).reshape(int(obs.shape[0]), -1)


def build_agent(**kwargs: Any) -> nn.Module:
    return NormalisedAgent()


def build_actor(**kwargs: Any) -> nn.Module:
    return NormalisedActor()


def probes(count: int, seed: int) -> Any:
    """Raw observations far from zero mean and unit scale (what the normaliser is for)."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(count, OBS_DIM, generator=gen) * 3.0 + 5.0).numpy()


def build(out: Path) -> dict[str, Path]:
    """The checkpoint and four artifacts (clean and normaliser-skipping, each format)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    agent = NormalisedAgent().eval()
    with torch.no_grad():
        agent.obs_rms.mean.copy_(torch.full((OBS_DIM,), 5.0))
        agent.obs_rms.var.copy_(torch.full((OBS_DIM,), 9.0))
    save_file({k: v.contiguous() for k, v in agent.state_dict().items()},
              str(out / "agent.safetensors"))
    actor_state = {k: v for k, v in agent.state_dict().items() if not k.startswith("value_head")}
    example = torch.zeros(4, OBS_DIM)
    paths = {"checkpoint": out / "agent.safetensors"}
    for name, cls in (("clean", NormalisedActor), ("skips", SkipsNormaliser)):
        model = cls().eval()
        model.load_state_dict(actor_state)
        with torch.no_grad():
            paths[f"{name}.pt"] = out / f"{name}.pt"
            torch.jit.save(torch.jit.trace(model, example, check_trace=False),
                           str(paths[f"{name}.pt"]))
            batch = torch.export.Dim("batch", min=1, max=4096)
            program = torch.export.export(model, (example,), dynamic_shapes=({0: batch},))
            paths[f"{name}.pt2"] = out / f"{name}.pt2"
            torch.export.save(program, str(paths[f"{name}.pt2"]))
    return paths


def config(paths: dict[str, Path], artifact: str, out: Path) -> dict[str, Any]:
    """The gate config of one artifact (``clean.pt``, ``skips.pt2``, ...)."""
    return {
        "name": "normalised-" + artifact.replace(".", "-"),
        "family": "policy",
        "seed": 0,
        "python_path": [str(Path(__file__).parent)],
        "allow_pickle": artifact.endswith(".pt2"),
        "policy": {
            "training_factory": "normaliser_subject:build_agent",
            "inference_factory": "normaliser_subject:build_actor",
            "checkpoint": str(paths["checkpoint"]),
            "artifact": str(paths[artifact]),
            "training_heads": ["value_head"],
            "policy_output": "logits",
            "output_names": ["logits"],
            "action_space": "discrete",
            "probes": {"generator": "normaliser_subject:probes", "count": 32, "seed": 0},
        },
        "golden": {"dir": str(out / "golden")},
    }
