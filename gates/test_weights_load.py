"""Gate: `weights_load`, measured by `paritygate.checks.weights_load`."""

import pytest


@pytest.mark.fast
def test_weights_load(gate_check):
    gate_check("weights_load")
