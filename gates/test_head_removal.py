"""Gate: `head_removal`, measured by `paritygate.checks.head_removal`."""

import pytest


@pytest.mark.fast
def test_head_removal(gate_check):
    gate_check("head_removal")
