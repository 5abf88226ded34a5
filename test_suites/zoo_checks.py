"""The fault zoo's check lists, derived from the check registry.

A family's zoo evaluates every fault (and its clean twin) on all of the family's checks,
except those that need a config section the zoo's base subjects lack: those run on their own
subjects (listed here with the reason). A new check joins its family's zoo by registering.
"""

from __future__ import annotations

from paritygate.checks import checks_for

OWN_SUBJECTS: dict[str, frozenset[str]] = {
    # recurrent_parity: a recurrent policy; rollout_parity: a policy.rollout section;
    # precision_per_layer: a precision section; serving_replay: recorded serving traffic.
    "policy": frozenset({"recurrent_parity", "rollout_parity", "precision_per_layer",
                         "serving_replay"}),
    # behaviour_parity, reward_parity, reference_parity: their own zoos;
    # precision_per_layer: a precision section; routing_agreement: MoE models (its own zoo).
    "causal_lm": frozenset({"precision_per_layer", "behaviour_parity", "reward_parity",
                            "reference_parity", "routing_agreement"}),
}


def zoo_checks(family: str) -> tuple[str, ...]:
    """The checks every base subject of ``family``'s zoo is evaluated on, in checklist order."""
    skip = OWN_SUBJECTS.get(family, frozenset())
    return tuple(spec.id for spec in checks_for(family) if spec.id not in skip)
