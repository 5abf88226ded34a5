"""Gate: `preprocessing_parity`, measured by `paritygate.checks.preprocessing_parity`."""

import pytest


@pytest.mark.fast
def test_preprocessing_parity(gate_check):
    gate_check("preprocessing_parity")
