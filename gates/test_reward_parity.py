"""Gate: `reward_parity`, measured by `paritygate.checks.reward_parity`."""

import pytest


@pytest.mark.fast
def test_reward_parity(gate_check):
    gate_check("reward_parity")
