"""Continuous-action policies as RL teams ship them, and their faulty serving variants.

``CleanRLAgent``: CleanRL's PPO actor-critic for continuous control (``actor_mean`` MLP, a bare
``actor_logstd`` parameter, a ``critic``); the served actor keeps ``actor_mean`` only.
``SACActor``: a SAC actor (mean and clamped log_std heads) beside a Q-network; the served actor
returns the deterministic env action ``bias + scale * tanh(mean)`` and its log_std. The faulty
variants each skip or change one step of that transform (the fault zoo's continuous entries);
``CleanRLClippedActor`` serves the env action, the mean clipped to the box.
Weights are seeded, not trained: the gate compares paths, not returns.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

OBS_DIM = 6
ACT_DIM = 2
HIDDEN = 32
LOG_STD_CLAMP = (-5.0, 2.0)
ACTION_SCALE = (2.0, 1.0)
ACTION_BIAS = (0.5, -0.25)
CLIP_BOUND = 1.0
"""The clipped CleanRL actor's action box [-1, 1] (``squash: clip``, ``action_scale: 1.0``)."""


def _mlp(out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(OBS_DIM, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN),
                         nn.Tanh(), nn.Linear(HIDDEN, out))


class CleanRLAgent(nn.Module):
    """CleanRL ``ppo_continuous_action.py``'s Agent; forward -> ``{"mean", "value"}``."""

    def __init__(self) -> None:
        super().__init__()
        self.critic = _mlp(1)
        self.actor_mean = _mlp(ACT_DIM)
        self.actor_logstd = nn.Parameter(torch.full((1, ACT_DIM), -0.5))

    def forward(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"mean": self.actor_mean(obs), "value": self.critic(obs)}


class CleanRLActor(nn.Module):
    """The served actor: ``actor_mean`` only (the deterministic action's mean)."""

    def __init__(self) -> None:
        super().__init__()
        self.actor_mean = _mlp(ACT_DIM)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor_mean(obs)  # type: ignore[no-any-return]


class SACActor(nn.Module):
    """A SAC actor: trunk, mean and log_std heads; log_std clamped like SB3's."""

    clamp = LOG_STD_CLAMP
    action_scale: torch.Tensor
    action_bias: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(OBS_DIM, HIDDEN), nn.ReLU(),
                                   nn.Linear(HIDDEN, HIDDEN), nn.ReLU())
        self.fc_mean = nn.Linear(HIDDEN, ACT_DIM)
        self.fc_logstd = nn.Linear(HIDDEN, ACT_DIM)
        self.register_buffer("action_scale", torch.tensor(ACTION_SCALE))
        self.register_buffer("action_bias", torch.tensor(ACTION_BIAS))

    def params(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.trunk(obs)
        return self.fc_mean(h), self.fc_logstd(h).clamp(*self.clamp)

    def act(self, mean: torch.Tensor) -> torch.Tensor:
        return self.action_bias + self.action_scale * torch.tanh(mean)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The served actor: (deterministic env action, log_std)."""
        mean, log_std = self.params(obs)
        return self.act(mean), log_std


class SACAgent(nn.Module):
    """The training model: the actor and a Q-network; forward -> ``{"mean", "log_std", "q"}``."""

    def __init__(self) -> None:
        super().__init__()
        self.actor = SACActor()
        self.qf1 = nn.Sequential(nn.Linear(OBS_DIM + ACT_DIM, HIDDEN), nn.ReLU(),
                                 nn.Linear(HIDDEN, 1))

    def forward(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        mean, log_std = self.actor.params(obs)
        q = self.qf1(torch.cat([obs, self.actor.act(mean)], dim=-1))
        return {"mean": mean, "log_std": log_std, "q": q}


class SACServed(nn.Module):
    """The served SAC actor alone (state-dict keys under ``actor.``)."""

    actor_cls: type[SACActor] = SACActor

    def __init__(self) -> None:
        super().__init__()
        self.actor = self.actor_cls()

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.actor(obs)  # type: ignore[no-any-return]


# --- faulty served actors: one step of the action transform skipped or changed -----------------


class _NoTanh(SACActor):
    def act(self, mean: torch.Tensor) -> torch.Tensor:
        return self.action_bias + self.action_scale * mean


class _NoScale(SACActor):
    def act(self, mean: torch.Tensor) -> torch.Tensor:
        return self.action_bias + torch.tanh(mean)


class _NoBias(SACActor):
    def act(self, mean: torch.Tensor) -> torch.Tensor:
        return self.action_scale * torch.tanh(mean)


class _OtherClamp(SACActor):
    clamp = (-3.0, 2.0)


class _LooserClamp(SACActor):
    clamp = (-20.0, 2.0)


class CleanRLClippedActor(CleanRLActor):
    """A served actor returning the env action: the mean clipped to the action box."""

    bound = CLIP_BOUND

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor_mean(obs).clamp(-self.bound, self.bound)  # type: ignore[no-any-return]


class _OtherClip(CleanRLClippedActor):
    bound = 0.1


def _served(actor_cls: type[SACActor]) -> type[SACServed]:
    return type(f"SACServed{actor_cls.__name__}", (SACServed,), {"actor_cls": actor_cls})


def build_cleanrl_agent() -> nn.Module:
    return CleanRLAgent()


def build_cleanrl_actor() -> nn.Module:
    return CleanRLActor()


def build_sac_agent() -> nn.Module:
    return SACAgent()


def build_sac_actor() -> nn.Module:
    return SACServed()


def build_sac_actor_without_tanh() -> nn.Module:
    return _served(_NoTanh)()


def build_sac_actor_without_scale() -> nn.Module:
    return _served(_NoScale)()


def build_sac_actor_without_bias() -> nn.Module:
    return _served(_NoBias)()


def build_sac_actor_other_clamp() -> nn.Module:
    return _served(_OtherClamp)()


def build_sac_actor_looser_clamp() -> nn.Module:
    return _served(_LooserClamp)()


def build_cleanrl_clipped_actor() -> nn.Module:
    return CleanRLClippedActor()


def build_cleanrl_actor_other_clip() -> nn.Module:
    return _OtherClip()


def probe_observations(count: int, seed: int) -> np.ndarray:
    """Raw observations (count, OBS_DIM), float32."""
    rng = np.random.default_rng(seed)
    return rng.normal(0.0, 1.5, size=(count, OBS_DIM)).astype(np.float32)


def build(out_dir: Path, *, seed: int = 0) -> dict[str, Path]:
    """Seeded checkpoints of both policies: ``cleanrl.pt`` a training checkpoint
    (``{"agent": {"actor_critic": state_dict}, "optimizer": ..., "global_step": N}``) and
    ``sac.safetensors`` (its log_std head's bias pushed down so the clamp binds on some probes)."""
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    agent = CleanRLAgent()
    optimizer = torch.optim.Adam(agent.parameters(), lr=3e-4)
    agent(torch.zeros(4, OBS_DIM))["mean"].sum().backward()
    optimizer.step()
    cleanrl = out_dir / "cleanrl.pt"
    torch.save({"agent": {"actor_critic": agent.state_dict()},
                "optimizer": optimizer.state_dict(), "global_step": 2048}, cleanrl)
    sac = SACAgent()
    with torch.no_grad():
        sac.actor.fc_logstd.weight.mul_(8.0)
        sac.actor.fc_logstd.bias.fill_(-3.5)
        sac.actor.fc_mean.weight.mul_(4.0)
    sac_path = out_dir / "sac.safetensors"
    save_file({k: v.contiguous() for k, v in sac.state_dict().items()}, str(sac_path))
    return {"cleanrl": cleanrl, "sac": sac_path}
