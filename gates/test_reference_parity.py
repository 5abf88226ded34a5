"""Gate: `reference_parity`, measured by `paritygate.checks.reference_parity`."""

import pytest


@pytest.mark.fast
def test_reference_parity(gate_check):
    gate_check("reference_parity")
