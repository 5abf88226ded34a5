"""Continuous (Gaussian) policies: the distribution maths against torch's, and the README's
CleanRL config gated end to end through the CLI with nothing but the files it names."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml

from paritygate.config.policy import DistributionSpec
from paritygate.metrics.gaussian import (
    action_log_prob,
    behaviour_logprob_delta,
    gaussian,
    kl_per_row,
    squash,
)

README = Path(__file__).resolve().parents[2] / "docs" / "policy" / "continuous.md"


def _sides(seed: int = 0) -> tuple[DistributionSpec, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    dist = DistributionSpec(squash="tanh", action_scale=[2.0, 0.5], action_bias=[0.5, -1.0],
                            log_std_clamp=[-5.0, 2.0], samples=4)
    return dist, rng.normal(0, 1, (6, 2)), rng.normal(-1, 0.5, (6, 2))


def test_log_prob_and_kl_match_torch() -> None:
    import torch
    from torch.distributions import (
        AffineTransform,
        Independent,
        Normal,
        TanhTransform,
        TransformedDistribution,
        kl_divergence,
    )

    dist, mean, log_std = _sides()
    g = gaussian(dist, mean, log_std)
    u = np.random.default_rng(1).normal(0, 1, (6, 4, 2)) + mean[:, None, :]
    base = Independent(Normal(torch.tensor(mean)[:, None, :],
                              torch.tensor(np.exp(log_std))[:, None, :]), 1)
    squashed = TransformedDistribution(base, [TanhTransform(), AffineTransform(
        torch.tensor([0.5, -1.0], dtype=torch.float64), torch.tensor([2.0, 0.5],
                                                                      dtype=torch.float64))])
    action = torch.tensor(squash(dist, u))
    np.testing.assert_allclose(action_log_prob(dist, g, u), squashed.log_prob(action).numpy(),
                               rtol=1e-6, atol=1e-6)
    other = gaussian(dist, mean + 0.1, log_std - 0.2)
    expected = kl_divergence(Independent(Normal(torch.tensor(mean), torch.tensor(g.std)), 1),
                             Independent(Normal(torch.tensor(other.mean),
                                                torch.tensor(other.std)), 1))
    np.testing.assert_allclose(kl_per_row(g, other), expected.numpy(), rtol=1e-10)


def test_behaviour_logprob_delta_is_zero_for_one_policy_and_names_another_std() -> None:
    dist, mean, log_std = _sides()
    g = gaussian(dist, mean, log_std)
    same = behaviour_logprob_delta(dist, g, g, seed=0)
    assert same.shape == (6, 4) and np.abs(same).max() < 1e-6
    wider = gaussian(dist, mean, log_std + 0.1)
    assert np.abs(behaviour_logprob_delta(dist, wider, g, seed=0)).max() > 0.05
    assert np.array_equal(behaviour_logprob_delta(dist, wider, g, seed=0),
                          behaviour_logprob_delta(dist, wider, g, seed=0))  # deterministic


def test_readme_cleanrl_config_passes_end_to_end(tmp_path: Path) -> None:
    """The README's CleanRL block, written as it stands (only the checkpoint's folder is
    built), blessed once and gated again through ``paritygate run``: exit 0."""
    from paritygate.demo import continuous

    block = next(b for b in re.findall(r"```yaml\n(.*?)```", README.read_text(), re.S)
                 if "name: cleanrl-ppo" in b)
    (tmp_path / "configs").mkdir()
    config = tmp_path / "configs" / "cleanrl.yaml"
    config.write_text(block, encoding="utf-8")
    continuous.build(tmp_path / "runs" / "cleanrl")
    assert yaml.safe_load(block)["policy"]["checkpoint"] == "../runs/cleanrl/cleanrl.pt"
    env = {k: v for k, v in os.environ.items()
           if k not in ("GITHUB_STEP_SUMMARY", "PARITYGATE_CONFIG")}
    for args in (["--update-golden"], []):
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "paritygate", "run", str(config), *args],
                              cwd=tmp_path, capture_output=True, text=True, timeout=300,
                              env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    print(f"gate run: {time.perf_counter() - start:.1f}s")
    assert (tmp_path / "golden" / "cleanrl-ppo" / "logits_agreement.json").exists()
