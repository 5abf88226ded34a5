"""Gate: `logits_agreement` (see DESIGN.md's checklist)."""

import pytest


@pytest.mark.fast
def test_logits_agreement(gate_check):
    gate_check("logits_agreement")
