"""Gate: `vllm_delta` (see DESIGN.md's checklist)."""

import pytest


@pytest.mark.vllm
@pytest.mark.gpu
def test_vllm_delta(gate_check):
    gate_check("vllm_delta")
