"""Gate: `logprob_impl`, measured by `paritygate.checks.logprob_impl`."""

import pytest


@pytest.mark.fast
def test_logprob_impl(gate_check):
    gate_check("logprob_impl")
