"""Gate: `precision_per_layer` (see DESIGN.md's checklist)."""

import pytest


@pytest.mark.fast
def test_precision_per_layer(gate_check):
    gate_check("precision_per_layer")
