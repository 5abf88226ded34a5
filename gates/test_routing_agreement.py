"""Gate: `routing_agreement`, measured by `paritygate.checks.routing_agreement`."""

import pytest


@pytest.mark.fast
def test_routing_agreement(gate_check):
    gate_check("routing_agreement")
