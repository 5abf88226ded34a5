"""Gate: `weights_load` (see DESIGN.md's checklist)."""

import pytest


@pytest.mark.fast
def test_weights_load(gate_check):
    gate_check("weights_load")
