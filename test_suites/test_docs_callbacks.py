"""The callbacks' code examples run as written: each ``<!-- docs-test: script (...) -->`` python
block of the docs is saved under its title and run in a fresh folder; it must exit 0 and print
one outcome per save, the first blessed and every one passing."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_docs import PAGES, Block, blocks

SCRIPTS = [b for b in blocks(PAGES) if b.marker and b.marker.startswith("script ")]


def test_the_trainer_and_sb3_pages_each_have_a_callback_script() -> None:
    pages = {b.page.name for b in SCRIPTS}
    assert {"training.md", "sb3.md"} <= pages, pages
    for block in SCRIPTS:
        assert block.lang == "python" and re.search(r'title="[\w.-]+\.py"', block.attrs), \
            block.where


@pytest.mark.parametrize("block", SCRIPTS, ids=lambda b: b.where)
def test_a_callback_script_runs_blesses_its_first_save_and_passes(
    block: Block, tmp_path: Path
) -> None:
    if "trl" in block.body:
        pytest.importorskip("trl")
    else:
        pytest.importorskip("stable_baselines3")
    title = re.search(r'title="([^"]+)"', block.attrs)
    assert title is not None
    script = tmp_path / title.group(1)
    script.write_text(block.body, encoding="utf-8")
    proc = subprocess.run([sys.executable, script.name], cwd=tmp_path, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # one line per save (the SB3 callback prints each outcome itself as well)
    lines = list(dict.fromkeys(ln for ln in proc.stdout.splitlines()
                               if ln.startswith("paritygate: ") and "(step " in ln and "[" in ln))
    assert len(lines) == 2, proc.stdout
    assert "blessed as the run's golden baseline" in lines[0], lines[0]
    assert all("): pass" in ln for ln in lines), lines
