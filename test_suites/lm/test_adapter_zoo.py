"""A LoRA policy (real peft, on the demo LM) served without its adapter or merged under another
lora_alpha: the root cause is the adapter, with the modules and the rank of the difference,
never another checkpoint. Its clean twin, the adapter re-merged at its training scale, passes
every LM check (``lora_merged`` in lm_zoo.CLEAN_VARIANTS)."""

from __future__ import annotations

import pytest
from lm_zoo import LM_CHECKS, LORA_RANK

from paritygate.rootcause import explain

pytest.importorskip("peft")


@pytest.mark.parametrize("name", ["lora_base_served", "lora_other_scale"])
def test_an_adapter_merged_otherwise_is_named(lm_variants, name: str) -> None:
    weights = lm_variants.evaluate(name, "weights_load")
    assert weights.status == "fail"
    assert weights.finding_kinds() == ["adapter_difference"], weights.reasons
    assert "different checkpoint" not in weights.message
    assert "an adapter not merged, merged with another scale, or another adapter" in \
        weights.message
    adapter = weights.details["adapter_difference"]
    assert adapter["modules"] == ["q_proj", "v_proj"] and adapter["tensors"] == 4
    assert set(adapter["ranks"].values()) == {LORA_RANK}
    _, root = explain([lm_variants.evaluate(name, cid) for cid in LM_CHECKS])
    assert root is not None
    assert (root.check, root.kind, root.finding) == ("weights_load", "adapter_difference",
                                                     "adapter_difference")
    assert root.fix is not None and "lora_alpha" in root.fix
    assert {"logits_agreement", "logprob_delta"} <= set(root.explains)
