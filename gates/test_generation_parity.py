"""Gate: `generation_parity` (see DESIGN.md's checklist)."""

import pytest


@pytest.mark.fast
def test_generation_parity(gate_check):
    gate_check("generation_parity")
