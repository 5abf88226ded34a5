"""``paritygate history``: a run's gate reports as one page, read back in a real browser.

The run is four checkpoint reports laid out as the trainer callbacks write them
(``OUTPUT_DIR/paritygate/checkpoint-N/report.json``, the schema every gate writes): steps 2 and 4
pass, step 6 fails with ``logits_agreement: stale_artifact`` as its root cause, step 8 fails too.
The page must mark step 6 (not 8) as the first failure with its root cause, link every step to
its ``report.html`` and plot each check's key metric against its threshold. Headless Chromium
renders it: the DOM it builds holds the marked row and the embedded plots decode, and its
screenshot is not blank. A real ``run --all``'s history is in ``lm/test_trainer_output.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from paritygate.report.history import read_history, write_history

STEPS = {2: 2.0e-6, 4: 3.0e-6, 6: 4.1e-3, 8: 5.0e-3}
THRESHOLD = 2e-5


def _report(step: int, value: float) -> dict[str, object]:
    failed = value > THRESHOLD
    checks = [
        {"id": "weights_load", "status": "pass", "key_metric": "missing_keys",
         "metrics": {"missing_keys": 0}, "thresholds": {"missing_keys": 0}},
        {"id": "logits_agreement", "status": "fail" if failed else "pass",
         "key_metric": "max_abs_diff", "metrics": {"max_abs_diff": value},
         "thresholds": {"max_abs_diff": THRESHOLD}},
        {"id": "export_integrity", "status": "fail" if failed else "pass",
         "key_metric": "stale_checkpoint", "metrics": {"stale_checkpoint": int(failed)},
         "thresholds": {"stale_checkpoint": 0}},
    ]
    root = {"check": "logits_agreement", "kind": "stale_artifact"} if failed else None
    return {"name": "policy", "status": "fail" if failed else "pass", "root_cause": root,
            "checkpoint": {"path": f"out/checkpoint-{step}",
                           "trainer": {"step": step, "output_dir": "out"}},
            "checks": checks}


def _run(root: Path) -> Path:
    out = root / "out"
    for step, value in STEPS.items():
        folder = out / "paritygate" / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        (folder / "report.json").write_text(json.dumps(_report(step, value)), encoding="utf-8")
        (folder / "report.html").write_text(f"<p>step {step}</p>", encoding="utf-8")
    return out


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def test_history_marks_the_first_failing_step_and_links_each_report(tmp_path: Path) -> None:
    out = _run(tmp_path)
    history = read_history(out)
    assert [s.step for s in history.steps] == [2, 4, 6, 8]
    assert history.first_failure is not None and history.first_failure.step == 6
    assert history.first_failure.root == "logits_agreement: stale_artifact"
    page = write_history(out)
    assert page == out / "paritygate" / "history.html"
    text = page.read_text(encoding="utf-8")
    assert 'id="first-failure"' in text and "First failing step: 6" in text
    for step in STEPS:
        assert f'href="checkpoint-{step}/report.html"' in text
    assert text.count("data:image/png;base64,") == 3  # one plot per check, embedded
    for check in ("weights_load", "logits_agreement", "export_integrity"):
        assert (page.parent / "history" / f"{check}.png").stat().st_size > 1000


def test_history_page_in_a_headless_browser(tmp_path: Path) -> None:
    browser = _chromium()
    if browser is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (.ci/run installs it)")
        pytest.skip("chromium not installed (apt-get install chromium)")
    page = write_history(_run(tmp_path))
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([browser, *flags, "--dump-dom", page.as_uri()], capture_output=True,
                         text=True, timeout=300, check=False)
    assert dom.returncode == 0, dom.stderr[-2000:]
    row = dom.stdout.split('id="first-failure"', 1)[1].split("</tr>", 1)[0]
    assert "<td>6</td>" in row and "logits_agreement: stale_artifact" in row, row
    assert dom.stdout.count("<img") == 3
    shot = tmp_path / "history.png"
    grab = subprocess.run([browser, *flags, f"--screenshot={shot}", "--window-size=1200,1400",
                           "--hide-scrollbars", page.as_uri()], capture_output=True, text=True,
                          timeout=300, check=False)
    assert grab.returncode == 0 and shot.is_file(), grab.stderr[-2000:]
    import numpy as np
    from PIL import Image

    pixels = np.asarray(Image.open(shot).convert("RGB"), dtype=np.float64)
    assert pixels.shape[0] >= 1000 and pixels.std() > 10, pixels.std()  # drawn, not blank
    red = (pixels[..., 0] > 150) & (pixels[..., 1] < 90) & (pixels[..., 2] < 90)
    assert red.sum() > 50  # the failed points and the first-failure mark are drawn


def test_a_folder_without_reports_is_bad_input(tmp_path: Path) -> None:
    empty = tmp_path / "run"
    (empty / "paritygate").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k != "PARITYGATE_CONFIG"}
    proc = subprocess.run([sys.executable, "-m", "paritygate", "history", str(empty)],
                          capture_output=True, text=True, timeout=300, env=env, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(empty / "paritygate") in lines[0], lines
    assert "no gate reports" in lines[0] and "Traceback" not in proc.stderr
