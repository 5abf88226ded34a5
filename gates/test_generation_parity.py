"""Gate: `generation_parity`, measured by `paritygate.checks.generation_parity`."""

import pytest


@pytest.mark.fast
def test_generation_parity(gate_check):
    gate_check("generation_parity")
