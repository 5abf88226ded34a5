"""Gate: `sampling_config` (see DESIGN.md's checklist)."""

import pytest


@pytest.mark.fast
def test_sampling_config(gate_check):
    gate_check("sampling_config")
