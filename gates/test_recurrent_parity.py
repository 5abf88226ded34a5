"""Gate: `recurrent_parity`, measured by `paritygate.checks.recurrent_parity`."""

import pytest


@pytest.mark.fast
def test_recurrent_parity(gate_check):
    gate_check("recurrent_parity")
