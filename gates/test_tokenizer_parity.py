"""Gate: `tokenizer_parity`, measured by `paritygate.checks.tokenizer_parity`."""

import pytest


@pytest.mark.fast
def test_tokenizer_parity(gate_check):
    gate_check("tokenizer_parity")
