"""Gate: `behaviour_parity`, measured by `paritygate.checks.behaviour_parity`."""

import pytest


@pytest.mark.slow
def test_behaviour_parity(gate_check):
    gate_check("behaviour_parity")
