"""Faulty variants of the demo policy, one per known way an inference path drifts from training.

The fault zoo (``test_suites/policy``) points gate configs at these factories and
preprocessing functions (``paritygate.demo.faults:<name>``) to prove each check
fails on its fault with a message naming the cause. They are importable from any
process (gate CLI, pytest-xdist workers), so they live in the package, not in the
test folder. Each class reproduces one real mistake; none is used by the clean demo.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.modules.module import _IncompatibleKeys

from paritygate.demo.policy import (
    HIDDEN,
    N_ACTIONS,
    OBS_DIM,
    InferencePolicy,
    TrainingPolicy,
    load_stats,
)

# --- weights_load ---------------------------------------------------------------------------------


class SkippingLoadInference(InferencePolicy):
    """Serving model whose loader silently skips ``policy_head.bias`` (keeps its random init).

    Mimics a hand-written ``load_state_dict`` that filters keys and loads non-strictly.
    """

    SKIPPED = "policy_head.bias"

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True,
                        assign: bool = False) -> _IncompatibleKeys:
        kept = {k: v for k, v in state_dict.items() if k != self.SKIPPED}
        return super().load_state_dict(kept, strict=False, assign=assign)


def build_skipping_load_inference(**kwargs: Any) -> nn.Module:
    return SkippingLoadInference(**kwargs)


# --- batchnorm_export -----------------------------------------------------------------------------

_BN_STATS = ("running_mean", "running_var")


def _nonpersistent_batchnorm(model: nn.Module) -> nn.Module:
    """Register every BatchNorm's running statistics as non-persistent buffers.

    They still update during training but never reach ``state_dict()``, so the
    checkpoint silently lacks them and every reload normalises with mean 0, var 1.
    """
    for mod in model.modules():
        if isinstance(mod, nn.modules.batchnorm._BatchNorm):
            mod._non_persistent_buffers_set.update(_BN_STATS)
    return model


def build_nonpersistent_bn_training(**kwargs: Any) -> nn.Module:
    return _nonpersistent_batchnorm(TrainingPolicy(**kwargs))


def build_nonpersistent_bn_inference(**kwargs: Any) -> nn.Module:
    return _nonpersistent_batchnorm(InferencePolicy(**kwargs))


# --- head_removal ---------------------------------------------------------------------------------


class NoDropoutInference(nn.Module):
    """Serving model written without the Dropout entries: the trunk's Sequential indices shift.

    The checkpoint's ``trunk.4`` (second Linear) now names a BatchNorm and ``trunk.5``
    (second BatchNorm) names nothing, so a non-strict load puts the Linear's bias into
    the BatchNorm and leaves the second Linear at random init.
    """

    def __init__(self, obs_dim: int = OBS_DIM, n_actions: int = N_ACTIONS, hidden: int = HIDDEN,
                 dropout: float = 0.1) -> None:
        super().__init__()
        self.trunk = nn.Sequential(
            nn.Linear(obs_dim, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
        )
        self.policy_head = nn.Linear(hidden, n_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.policy_head(self.trunk(obs))  # (B, A)


def build_no_dropout_inference(**kwargs: Any) -> nn.Module:
    return NoDropoutInference(**kwargs)


class SharedNormTraining(TrainingPolicy):
    """Training model with a LayerNorm on the trunk output, shared by every head."""

    def __init__(self, obs_dim: int = OBS_DIM, n_actions: int = N_ACTIONS, hidden: int = HIDDEN,
                 dropout: float = 0.1) -> None:
        super().__init__(obs_dim, n_actions, hidden, dropout)
        self.norm = nn.LayerNorm(hidden)

    def forward(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.norm(self.trunk(obs))  # (B, H)
        return {"logits": self.policy_head(h), "value": self.value_head(h).squeeze(-1),
                "aux": self.aux_head(h)}


def build_shared_norm_training(**kwargs: Any) -> nn.Module:
    return SharedNormTraining(**kwargs)


# The serving side of the shared-norm fault is the plain InferencePolicy: the norm was
# declared a training head and removed with the value and auxiliary heads.


class SkippedReluInference(InferencePolicy):
    """Serving forward that forgets the trunk's last ReLU (index 6)."""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        h = obs
        for i, layer in enumerate(self.trunk):
            if i == 6:
                continue
            h = layer(h)  # (B, H)
        return self.policy_head(h)


def build_skipped_relu_inference(**kwargs: Any) -> nn.Module:
    return SkippedReluInference(**kwargs)


class PolicyAndValue(nn.Module):
    """Wraps the training model to return ``(logits, value)``: an export that kept a head."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model(obs)
        return out["logits"], out["value"]  # (B, A), (B,)


# --- dropout_off ----------------------------------------------------------------------------------


class ForcedTrainInference(InferencePolicy):
    """Serving model whose ``train()`` ignores its argument, so ``eval()`` leaves it training."""

    def train(self, mode: bool = True) -> ForcedTrainInference:
        return super().train(True)


def build_forced_train_inference(**kwargs: Any) -> nn.Module:
    return ForcedTrainInference(**kwargs)


class HardDropoutInference(InferencePolicy):
    """Serving forward calling ``F.dropout(..., training=True)`` after the first block."""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        t = self.trunk
        h = t[2](t[1](t[0](obs)))  # (B, H)
        h = F.dropout(h, p=t[3].p, training=True)  # type: ignore[arg-type]  # nn.Dropout.p
        h = t[6](t[5](t[4](h)))
        return self.policy_head(h)


def build_hard_dropout_inference(**kwargs: Any) -> nn.Module:
    return HardDropoutInference(**kwargs)


class StochasticDepthInference(InferencePolicy):
    """Serving forward that skips the second block per row with probability 0.2, in any mode."""

    DROP = 0.2

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        t = self.trunk
        h1 = t[2](t[1](t[0](obs)))  # (B, H)
        h2 = t[6](t[5](t[4](h1)))  # (B, H)
        keep = (torch.rand(h1.shape[0], 1) >= self.DROP).to(h1.dtype)  # (B, 1)
        return self.policy_head(h1 + keep * (h2 - h1))


def build_stochastic_depth_inference(**kwargs: Any) -> nn.Module:
    return StochasticDepthInference(**kwargs)


# --- preprocessing_parity (serving side) ----------------------------------------------------------

STALE_STATS_SUFFIX = ".previous.json"
"""The stale serving variant reads ``<stats>.previous.json``: last release's, still shipped."""


def _serve(raw: np.ndarray, s: Mapping[str, float], *, epsilon: float | None = None,
           clip: float | None = None, fill_zero: bool = False) -> np.ndarray:
    """The demo serving normaliser with one knob changed."""
    eps = np.float32(s["epsilon"] if epsilon is None else epsilon)
    lim = s["clip"] if clip is None else clip
    x = np.asarray(raw, dtype=np.float32).copy()  # (N, D)
    mean = np.asarray(s["mean"], dtype=np.float32)
    var = np.asarray(s["var"], dtype=np.float32)
    missing = np.isnan(x)
    x[missing] = 0.0 if fill_zero else np.broadcast_to(mean, x.shape)[missing]
    z = np.clip((x - mean) / np.sqrt(var + eps), -lim, lim)
    z[:, s["discrete"]] = x[:, s["discrete"]]
    return z.astype(np.float32)


def normalize_training_unclipped(raw: np.ndarray, *, stats_path: str | Path) -> np.ndarray:
    """A clean pair's training side: the demo normaliser without a clip (torch's division)."""
    import torch

    s = load_stats(stats_path)
    x = torch.as_tensor(np.asarray(raw, dtype=np.float32))
    mean = torch.tensor(s["mean"], dtype=torch.float32)
    var = torch.tensor(s["var"], dtype=torch.float32)
    x = torch.where(torch.isnan(x), mean.expand_as(x), x)
    z = (x - mean) / torch.sqrt(var + s["epsilon"])
    z[:, s["discrete"]] = x[:, s["discrete"]]
    return z.numpy()


def normalize_serving_unclipped(raw: np.ndarray, *, stats_path: str | Path) -> np.ndarray:
    """Its serving side, the same normaliser written otherwise (numpy, times the reciprocal
    square root): a unit or two in the last place apart, the size of which grows with the
    value (4.9e-4 at an extreme input's 5,000)."""
    s = load_stats(stats_path)
    x = np.asarray(raw, dtype=np.float32).copy()
    mean = np.asarray(s["mean"], dtype=np.float32)
    var = np.asarray(s["var"], dtype=np.float32)
    missing = np.isnan(x)
    x[missing] = np.broadcast_to(mean, x.shape)[missing]
    z = (x - mean) * (np.float32(1.0) / np.sqrt(var + np.float32(s["epsilon"])))
    z[:, s["discrete"]] = x[:, s["discrete"]]
    return z.astype(np.float32)


def normalize_serving_unclipped_epsilon(raw: np.ndarray, *, stats_path: str | Path) -> np.ndarray:
    """The same, with epsilon 1e-5 instead of the trainer's (the fault of the pair)."""
    return _serve(raw, load_stats(stats_path), epsilon=1e-5, clip=np.inf)


def normalize_serving_stale(raw: np.ndarray, *, stats_path: str | Path) -> np.ndarray:
    """Serving normaliser that loads the previous release's stats file."""
    p = Path(stats_path)
    return _serve(raw, load_stats(p.with_name(p.stem + STALE_STATS_SUFFIX)))


def normalize_serving_missing(raw: np.ndarray, *, stats_path: str | Path) -> np.ndarray:
    """Serving path without the normaliser: raw observations go straight to the model."""
    return np.asarray(raw, dtype=np.float32).copy()


def normalize_serving_epsilon(raw: np.ndarray, *, stats_path: str | Path) -> np.ndarray:
    """Serving normaliser with epsilon 1e-5 (a library default) instead of the trainer's."""
    return _serve(raw, load_stats(stats_path), epsilon=1e-5)


def normalize_serving_clip(raw: np.ndarray, *, stats_path: str | Path) -> np.ndarray:
    """Serving normaliser clipping at 5 instead of the trainer's clip."""
    return _serve(raw, load_stats(stats_path), clip=5.0)


def normalize_serving_sign_flipped(raw: np.ndarray, *, stats_path: str | Path) -> np.ndarray:
    """Serving normaliser whose feature 1 has the opposite sign (an axis convention flipped)."""
    z = _serve(raw, load_stats(stats_path))
    z[:, 1] = -z[:, 1]
    return z


def normalize_serving_fill_zero(raw: np.ndarray, *, stats_path: str | Path) -> np.ndarray:
    """Serving normaliser filling missing values with 0 instead of the feature mean."""
    return _serve(raw, load_stats(stats_path), fill_zero=True)


# --- preprocessing_parity: NaN propagation and non-finite values ----------------------------------
# Pipelines whose normaliser propagates missing values (NaN in, NaN out) instead of filling
# them: a pair that agrees (clean) and serving variants that differ in how they treat NaN.

LOG_FEATURE = 5
"""A strictly positive sensor (mean 1, std 0.01) that some pipelines log-transform."""


def normalize_training_propagate(raw: np.ndarray, *, stats_path: str | Path) -> torch.Tensor:
    """Training normaliser (torch) that propagates NaN: standardise and clip, no fill."""
    s = load_stats(stats_path)
    x = torch.as_tensor(np.asarray(raw, dtype=np.float32))  # (N, D)
    mean = torch.tensor(s["mean"], dtype=torch.float32)
    var = torch.tensor(s["var"], dtype=torch.float32)
    z = ((x - mean) / torch.sqrt(var + s["epsilon"])).clamp(-s["clip"], s["clip"])
    for j in s["discrete"]:
        z[:, j] = x[:, j]
    return z


def normalize_serving_propagate(raw: np.ndarray, *, stats_path: str | Path) -> np.ndarray:
    """Serving normaliser (numpy), the same contract: NaN in, NaN out at the same place."""
    s = load_stats(stats_path)
    x = np.asarray(raw, dtype=np.float32)  # (N, D)
    mean = np.asarray(s["mean"], dtype=np.float32)
    var = np.asarray(s["var"], dtype=np.float32)
    z = np.clip((x - mean) / np.sqrt(var + np.float32(s["epsilon"])), -s["clip"], s["clip"])
    z[:, s["discrete"]] = x[:, s["discrete"]]
    return z.astype(np.float32)


def normalize_training_log(raw: np.ndarray, *, stats_path: str | Path) -> torch.Tensor:
    """Training normaliser that log-transforms feature LOG_FEATURE first (NaN for x < 0)."""
    x = torch.as_tensor(np.asarray(raw, dtype=np.float32)).clone()
    x[:, LOG_FEATURE] = torch.log(x[:, LOG_FEATURE])
    return normalize_training_propagate(x.numpy(), stats_path=stats_path)


def normalize_serving_log(raw: np.ndarray, *, stats_path: str | Path) -> np.ndarray:
    """Serving counterpart of :func:`normalize_training_log` (numpy)."""
    x = np.asarray(raw, dtype=np.float32).copy()
    with np.errstate(invalid="ignore", divide="ignore"):
        x[:, LOG_FEATURE] = np.log(x[:, LOG_FEATURE])
    return normalize_serving_propagate(x, stats_path=stats_path)


def normalize_serving_log_guarded(raw: np.ndarray, *, stats_path: str | Path) -> np.ndarray:
    """Serving variant that guards the log with ``max(x, 1e-6)``: finite where training is NaN."""
    x = np.asarray(raw, dtype=np.float32).copy()
    with np.errstate(invalid="ignore"):
        x[:, LOG_FEATURE] = np.log(np.maximum(x[:, LOG_FEATURE], np.float32(1e-6)))
    return normalize_serving_propagate(x, stats_path=stats_path)


# --- Dict-observation demo (paritygate.demo.shapes) ---------------------------------------------


def scale_image_serving_256(raw: np.ndarray) -> np.ndarray:
    """Serving scales the 8-bit image by 1/256 instead of the trainer's 1/255."""
    return (np.asarray(raw, np.float32) / np.float32(256.0)).astype(np.float32)


def scale_image_serving_missing(raw: np.ndarray) -> np.ndarray:
    """Serving casts the 8-bit image to float but forgets the trainer's 1/255."""
    return np.asarray(raw, np.float32).copy()


def normalize_vector_missing(raw: np.ndarray, *, stats_path: str | Path) -> np.ndarray:
    """Serving passes the vector key through without standardising it."""
    return np.asarray(raw, np.float32).copy()


def build_untraceable_inference(**kwargs: Any) -> nn.Module:
    """The demo's serving model with a branch on the input's values: the exporter cannot
    trace it (data-dependent control flow), the torch forward runs."""
    from paritygate.demo.policy import InferencePolicy

    class Untraceable(InferencePolicy):
        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            logits = super().forward(obs)
            if bool(obs.sum() > 1e9):
                return logits * 2
            return logits

    return Untraceable(**kwargs)


class ProbsInference(InferencePolicy):
    """Serving model returning ``(logits, probs)``: the action probabilities as a second
    declared output, ``softmax(logits / temperature)``."""

    temperature = 1.0

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        logits = super().forward(obs)
        return logits, torch.softmax(logits / self.temperature, dim=-1)


class HotProbsInference(ProbsInference):
    """Its second output at temperature 0.5: the logits agree, the served probs do not."""

    temperature = 0.5


def build_probs_inference(**kwargs: Any) -> nn.Module:
    return ProbsInference(**kwargs)


class NanProbsInference(ProbsInference):
    """Its second output is NaN: the log of negative probabilities."""

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        logits, probs = super().forward(obs)
        return logits, torch.log(-probs)
