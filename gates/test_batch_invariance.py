"""Gate: `batch_invariance`, measured by `paritygate.checks.batch_invariance`."""

import pytest


@pytest.mark.fast
def test_batch_invariance(gate_check):
    gate_check("batch_invariance")
