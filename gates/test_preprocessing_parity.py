"""Gate: `preprocessing_parity` (see DESIGN.md's checklist)."""

import pytest


@pytest.mark.fast
def test_preprocessing_parity(gate_check):
    gate_check("preprocessing_parity")
