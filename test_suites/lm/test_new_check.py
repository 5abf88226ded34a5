"""A new check is its own module (and its block's), nothing shared: a throwaway LM check with a
config block, kinds, needs, a root-cause edge and a position, written to a temporary folder
beside the packages, joins the checklist, the config, the config reference, the schema, the
generated gate files and the root-cause graph, and runs on the config-only context its empty
``needs`` asks for, without one shared file edited."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from lm_zoo import variant_config

SECTION = '''
"""token_budget's block: the most new tokens serving may generate."""
from paritygate.sections import Section


class BudgetSpec(Section):
    FAMILY = "causal_lm"
    KEY = "budget"
    FIELD_DOC = "The serving side's budget of new tokens (token_budget)."
    max_new_tokens: int
    """The most new tokens the serving config may ask for."""


SECTION = BudgetSpec
'''

CHECK = '''
"""token_budget: the serving config asks for no more new tokens than the budget allows."""
from paritygate.causes import Explanation
from paritygate.check import CheckSpec
from paritygate.result import Measurement
from paritygate.sections.token_budget import BudgetSpec


def measure(ctx, thresholds):
    m = Measurement("token_budget")
    block = BudgetSpec.of(ctx.spec)
    if block is None:
        return m.skip("no causal_lm.budget block")
    asked = ctx.serving.sampling.spec().max_new_tokens
    m.metric("over_budget_tokens", max(0, asked - block.max_new_tokens), threshold=0)
    if asked > block.max_new_tokens:
        m.fail("over_budget", f"serving asks for {asked} new tokens, the budget is "
               f"{block.max_new_tokens}")
    return m


CHECK = CheckSpec(id="token_budget", summary="serving asks for no more new tokens than budgeted",
                  measures={"causal_lm": measure}, needs=(), kinds=("over_budget",))
CAUSES = (Explanation("token_budget", "budget_exceeded", ("over_budget",), ("sampling_config",),
                      "serving generates past the budget", fix="lower max_new_tokens", rank=5),)
POSITION = 75
'''

SCRIPT = '''
import importlib.util, json, sys
from pathlib import Path

extra = Path(sys.argv[1])
import paritygate
for name in ("sections", "checks"):  # the packages' folders and the temporary one
    spec = importlib.util.find_spec(f"paritygate.{name}")
    spec.submodule_search_locations.append(str(extra / name))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    setattr(paritygate, name, module)
    spec.loader.exec_module(module)

from paritygate.checks import CHECK_IDS, checks_for
from paritygate.errors import InputError
from paritygate.gate import Gate
from paritygate.load import config_from_dict
from paritygate.report import docgen
from paritygate.report.model import schema_texts
from paritygate.rootcause import GRAPH

out = {"ids": list(CHECK_IDS), "lm": [c.id for c in checks_for("causal_lm")],
       "checklist": "token_budget" in docgen.checklist_table(),
       "actions": "budget_exceeded" in docgen.root_cause_actions(),
       "reference": "causal_lm.budget.max_new_tokens" in json.dumps(docgen.generated_blocks()),
       "schema": '"budget"' in schema_texts()["config.schema.json"],
       "gate_file": docgen.gate_files(Path("."))[Path("gates/test_token_budget.py")],
       "edges": [(e.check, e.kind, list(e.explains)) for e in GRAPH if e.check == "token_budget"],
       "runs": {}}
for name in ("clean", "over", "bad"):
    data = json.loads(Path(extra, f"{name}.json").read_text())
    try:
        gate = Gate(config_from_dict(data, extra / "gate.yaml"))
    except InputError as exc:
        out["runs"][name] = {"error": exc.line()}
        continue
    gate.named = frozenset({"token_budget"})
    result = gate.evaluate("token_budget", golden=False)
    out["runs"][name] = {"needs": sorted(gate.needs), "status": result.status,
                         "kinds": result.finding_kinds()}
out["loaded"] = sorted(m for m in ("torch", "transformers") if m in sys.modules)
print(json.dumps(out))
'''


def test_a_new_check_is_its_own_modules(demo_lm: Path, tmp_path: Path) -> None:
    for folder, text in (("sections", SECTION), ("checks", CHECK)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "token_budget.py").write_text(text)
    base = variant_config(demo_lm, tmp_path, None)
    for name, block in (("clean", {"max_new_tokens": 100_000}), ("over", {"max_new_tokens": 1}),
                        ("bad", {"max_tokens": 1})):
        data: dict[str, Any] = {**base, "name": "new-check",
                                "causal_lm": {**base["causal_lm"], "budget": block}}
        (tmp_path / f"{name}.json").write_text(json.dumps(data))
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    # its position: after sampling_config (70), before logits_agreement (80)
    ids = found["ids"]
    assert ids.index("sampling_config") + 1 == ids.index("token_budget") == \
        ids.index("logits_agreement") - 1
    assert "token_budget" in found["lm"]
    assert found["checklist"] and found["actions"] and found["reference"] and found["schema"]
    assert '@pytest.mark.fast\ndef test_token_budget(gate_check):\n' in found["gate_file"]
    assert found["edges"] == [["token_budget", "budget_exceeded", ["sampling_config"]]]
    # needs nothing that loads: the config-only context, no torch in the process
    assert found["runs"]["clean"] == {"needs": [], "status": "pass", "kinds": []}
    assert found["runs"]["over"] == {"needs": [], "status": "fail", "kinds": ["over_budget"]}
    assert "causal_lm.budget.max_tokens" in found["runs"]["bad"]["error"]
    assert found["loaded"] == []


def test_a_setup_is_built_only_for_a_check_that_needs_it(demo_lm: Path, tmp_path: Path) -> None:
    """``needs``: a run of checks that do not need the reward setup never reads its block; a
    run that needs it refuses a bad block before any model loads, as a whole run does."""
    import pytest

    from paritygate.errors import InputError
    from paritygate.gate import Gate
    from paritygate.load import config_from_dict

    data = variant_config(demo_lm, tmp_path, None)
    data["causal_lm"]["reward"] = {"model_dir": str(tmp_path / "no-reward-model")}
    config = config_from_dict(data, tmp_path / "gate.yaml")
    gate = Gate(config)
    gate.named = frozenset({"logprob_impl"})
    assert gate.needs == {"models"}
    assert gate.context.reward is None  # type: ignore[attr-defined]
    unmet = gate.evaluate("reward_parity", golden=False)
    assert unmet.status == "error" and "needs reward" in unmet.message
    for named in ({"reward_parity"}, set()):
        refusing = Gate(config)
        refusing.named = frozenset(named)
        with pytest.raises(InputError, match=r"causal_lm\.reward\.model_dir"):
            refusing.context  # noqa: B018 - building it validates the block
