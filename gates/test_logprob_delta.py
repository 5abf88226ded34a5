"""Gate: `logprob_delta`, measured by `paritygate.checks.logprob_delta`."""

import pytest


@pytest.mark.fast
def test_logprob_delta(gate_check):
    gate_check("logprob_delta")
