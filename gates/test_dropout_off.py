"""Gate: `dropout_off`, measured by `paritygate.checks.dropout_off`."""

import pytest


@pytest.mark.fast
def test_dropout_off(gate_check):
    gate_check("dropout_off")
