"""Gate: `export_integrity`, measured by `paritygate.checks.export_integrity`."""

import pytest


@pytest.mark.fast
def test_export_integrity(gate_check):
    gate_check("export_integrity")
