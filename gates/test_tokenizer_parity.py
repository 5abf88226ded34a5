"""Gate: `tokenizer_parity` (see DESIGN.md's checklist)."""

import pytest


@pytest.mark.fast
def test_tokenizer_parity(gate_check):
    gate_check("tokenizer_parity")
