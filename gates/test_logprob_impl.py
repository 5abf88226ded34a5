"""Gate: `logprob_impl` (see DESIGN.md's checklist)."""

import pytest


@pytest.mark.fast
def test_logprob_impl(gate_check):
    gate_check("logprob_impl")
