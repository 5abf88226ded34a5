"""Gate: `vllm_delta`, measured by `paritygate.checks.vllm_delta`."""

import pytest


@pytest.mark.vllm
@pytest.mark.gpu
def test_vllm_delta(gate_check):
    gate_check("vllm_delta")
