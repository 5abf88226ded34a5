"""Gate: `logits_agreement`, measured by `paritygate.checks.logits_agreement`."""

import pytest


@pytest.mark.fast
def test_logits_agreement(gate_check):
    gate_check("logits_agreement")
