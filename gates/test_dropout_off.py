"""Gate: `dropout_off` (see DESIGN.md's checklist)."""

import pytest


@pytest.mark.fast
def test_dropout_off(gate_check):
    gate_check("dropout_off")
