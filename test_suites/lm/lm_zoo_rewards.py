"""Reward functions of a user's own for the behaviour_parity zoo
(``causal_lm.behaviour.reward_fn``)."""

from __future__ import annotations


def length_reward(prompt: str, completion: str) -> float:
    """Rewards longer answers up to 40 characters (a stand-in for a task reward)."""
    return min(1.0, len(completion) / 40.0)


def raises(prompt: str, completion: str) -> float:
    raise ValueError("cannot score this completion")
