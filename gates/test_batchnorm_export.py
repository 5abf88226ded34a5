"""Gate: `batchnorm_export`, measured by `paritygate.checks.batchnorm_export`."""

import pytest


@pytest.mark.fast
def test_batchnorm_export(gate_check):
    gate_check("batchnorm_export")
