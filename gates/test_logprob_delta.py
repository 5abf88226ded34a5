"""Gate: `logprob_delta` (see DESIGN.md's checklist)."""

import pytest


@pytest.mark.fast
def test_logprob_delta(gate_check):
    gate_check("logprob_delta")
