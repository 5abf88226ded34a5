"""Gate: `precision_per_layer`, measured by `paritygate.checks.precision_per_layer`."""

import pytest


@pytest.mark.fast
def test_precision_per_layer(gate_check):
    gate_check("precision_per_layer")
