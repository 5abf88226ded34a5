"""Gate: `head_removal` (see DESIGN.md's checklist)."""

import pytest


@pytest.mark.fast
def test_head_removal(gate_check):
    gate_check("head_removal")
