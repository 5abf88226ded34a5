"""Gate: `rollout_parity`, measured by `paritygate.checks.rollout_parity`."""

import pytest


@pytest.mark.fast
def test_rollout_parity(gate_check):
    gate_check("rollout_parity")
