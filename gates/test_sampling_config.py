"""Gate: `sampling_config`, measured by `paritygate.checks.sampling_config`."""

import pytest


@pytest.mark.fast
def test_sampling_config(gate_check):
    gate_check("sampling_config")
