"""Gate: `export_integrity` (see DESIGN.md's checklist)."""

import pytest


@pytest.mark.fast
def test_export_integrity(gate_check):
    gate_check("export_integrity")
