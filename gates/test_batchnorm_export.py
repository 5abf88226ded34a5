"""Gate: `batchnorm_export` (see DESIGN.md's checklist)."""

import pytest


@pytest.mark.fast
def test_batchnorm_export(gate_check):
    gate_check("batchnorm_export")
