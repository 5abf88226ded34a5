"""Gate: `serving_replay`, measured by `paritygate.checks.serving_replay`."""

import pytest


@pytest.mark.fast
def test_serving_replay(gate_check):
    gate_check("serving_replay")
