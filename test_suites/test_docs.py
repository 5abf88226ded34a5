"""The documentation cannot drift from the tool: the site builds strictly, its generated parts
equal the code's, every link lands, every config example validates, and every command block
either runs (on the demo, or in the PPO walkthrough) or says why it is not run.

A fenced block with a ``paritygate`` command is preceded by one marker line:
``<!-- docs-test: demo -->`` (run here on the demo policy), ``<!-- docs-test: ppo -->`` (run by
the PPO walkthrough, in page order) or ``<!-- docs-test: not-run (reason) -->``.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from paritygate.checks import CHECK_IDS, get_check
from paritygate.config import GateConfig
from paritygate.load import config_from_dict
from paritygate.report import docgen

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = (README, *sorted(DOCS.rglob("*.md")))
GATE_KEYS = frozenset(GateConfig.model_fields)
FENCE = re.compile(r"^(?:<!-- docs-test: (?P<marker>[^\n]*?) -->\n)?"
                   r"(?P<indent> *)```(?P<lang>[\w-]*)(?P<attrs>[^\n]*)\n"
                   r"(?P<body>.*?)^(?P=indent)```", re.M | re.S)
STUBS: dict[str, dict[str, object]] = {
    "policy": {"training_factory": "m:f", "inference_factory": "m:g",
               "checkpoint": "c.safetensors", "probes": {"generator": "m:p"}},
    "causal_lm": {"model_dir": "model", "probes": "probes.jsonl",
                  "sampling": {"training": "train.yaml"}},
    "hf_model": {"model_dir": "model", "probes": "probes.txt"},
}
"""What a config fragment leaves out, filled in so the fragment validates as a whole config."""


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: Path
    line: int
    lang: str
    attrs: str
    body: str
    marker: str | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def commands(self) -> list[str]:
        """The ``paritygate ...`` invocations of a shell block, comments dropped."""
        if self.lang not in ("bash", "sh", "shell", "console"):
            return []
        found = []
        for line in self.body.splitlines():
            line = line.split(" #", 1)[0].strip()
            for part in re.split(r"&&|;", line):
                part = part.strip()
                if part.startswith("paritygate "):
                    found.append(part)
        return found


def blocks(pages: tuple[Path, ...] = PAGES) -> list[Block]:
    found = []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            found.append(Block(page, text.count("\n", 0, m.start()) + 1, m["lang"],
                               m["attrs"].strip(), m["body"], m["marker"]))
    return found


def _gate_config(data: object) -> dict[str, object] | None:
    """The block as a whole gate config (fragments completed), or None when it is no config."""
    if not isinstance(data, dict) or not data.keys() & GATE_KEYS:
        return None
    if data.keys() & {"jobs", "on", True, "steps", "runs"}:  # a GitHub workflow or action
        return None
    if "name" in data and "family" in data:
        return data
    family = next((f for f in STUBS if f in data), str(data.get("family", "policy")))
    section = data.get(family)
    completed = {"name": "docs", "family": family, **data}
    completed[family] = {**STUBS[family], **(section if isinstance(section, dict) else {})}
    return completed


def test_mkdocs_build_is_strict_and_clean(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q",
                           "--site-dir", str(tmp_path / "site")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not re.search(r"^(WARNING|ERROR)", proc.stderr, re.M), proc.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "api" / "index.html").read_text().count("doc-heading") >= 10


def test_generated_blocks_equal_the_code() -> None:
    """README and docs hold the checklist, the config reference and the root-cause actions,
    and the gate files and schemas are, as generated now (``python -m
    paritygate.report.docgen`` rewrites them)."""
    stale = [str(p.relative_to(ROOT)) for p, text in docgen.generated_files(ROOT).items()
             if not p.is_file() or p.read_text(encoding="utf-8") != text]
    assert not stale, f"stale generated blocks (run python -m paritygate.report.docgen): {stale}"
    pages = {p.relative_to(ROOT).as_posix() for p, _ in docgen.spliced_files(ROOT).items()
             if "<!-- generated:" in p.read_text(encoding="utf-8")}
    assert {"README.md", "docs/index.md", "docs/report.md", "docs/reference/policy.md",
            "docs/reference/causal-lm.md", "docs/reference/hf-model.md"} <= pages


def _table_rows(text: str, header: str) -> list[list[str]]:
    lines = text[text.index(header):].splitlines()
    rows = []
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return rows


@pytest.mark.parametrize("page", [README, DOCS / "index.md"], ids=["README", "index"])
def test_checklist_table_is_the_registry(page: Path) -> None:
    rows = _table_rows(page.read_text(encoding="utf-8"), "| id | families | marks | proves |")
    assert [r[0].strip("`") for r in rows] == list(CHECK_IDS)
    for row in rows:
        spec = get_check(row[0].strip("`"))
        assert row[3] == spec.summary
        assert row[1] == ", ".join(f"`{f}`" for f in spec.families)
        assert row[2] == ", ".join(f"`{m}`" for m in spec.marks)


def test_every_check_is_described_once() -> None:
    rows = _table_rows((DOCS / "checks.md").read_text(encoding="utf-8"), "| id | family | proves |")
    assert [r[0].strip("`") for r in rows] == list(CHECK_IDS)


def test_config_reference_notes_name_real_keys() -> None:
    """A meaning the reference adds for an undocumented field names a key that exists."""
    from paritygate.report.configdoc import NOTES, model_keys

    paths = {k.path for k in model_keys(GateConfig)}
    assert set(NOTES) <= paths, set(NOTES) - paths
    assert all(k.description for k in model_keys(GateConfig))


def _anchors(page: Path) -> set[str]:
    """The heading ids MkDocs' toc gives a page."""
    ids = set()
    for heading in re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).strip()
        ids.add(re.sub(r"[\s]+", "-", slug))
    return ids


def test_every_readme_link_lands() -> None:
    text = README.read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert len(links) >= 20
    for link in links:
        if link.startswith(("http://", "https://")):
            continue
        target, _, anchor = link.partition("#")
        path = (ROOT / target).resolve()
        assert path.exists(), link
        if anchor:
            assert anchor in _anchors(path), link


def test_every_config_example_validates(tmp_path: Path) -> None:
    checked = []
    for block in blocks():
        if block.lang not in ("yaml", "yml"):
            continue
        data = _gate_config(yaml.safe_load(block.body))
        if data is None:
            continue
        config = config_from_dict(data, tmp_path / "gate.yaml")
        assert config.family in ("policy", "causal_lm", "hf_model"), block.where
        checked.append(block.where)
    assert len(checked) >= 20, checked


def test_every_command_block_runs_or_says_why_not() -> None:
    marked = {"demo": 0, "ppo": 0, "not-run": 0}
    for block in blocks():
        if not block.commands:
            continue
        assert block.marker is not None, f"{block.where}: a paritygate command block needs a marker"
        kind = block.marker.split(" ", 1)[0]
        assert kind in marked, f"{block.where}: unknown marker {block.marker!r}"
        if kind == "not-run":
            assert re.fullmatch(r"not-run \(.{8,}\)", block.marker), block.where
        marked[kind] += 1
    assert marked["demo"] >= 2 and marked["ppo"] >= 3, marked


@pytest.fixture(scope="module")
def demo_folder(build_once: Callable[..., Path],
                tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh copy of ``paritygate demo --only policy --out DIR``: its configs, golden, policy."""

    def build(out: Path) -> None:
        proc = subprocess.run([sys.executable, "-m", "paritygate", "demo", "--only", "policy",
                               "--out", str(out)], capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stdout + proc.stderr

    work = tmp_path_factory.mktemp("docs-demo") / "work"
    shutil.copytree(build_once("docs-demo-policy", build), work)
    return work


def _paritygate(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    args = shlex.split(command)
    assert args[0] == "paritygate"
    return subprocess.run([sys.executable, "-m", "paritygate", *args[1:]], cwd=cwd,
                          capture_output=True, text=True, timeout=600)


def test_demo_command_blocks_run(demo_folder: Path) -> None:
    """Each ``demo`` block's commands run on the demo policy with exit 0 (``paritygate demo``
    itself is what the fixture ran)."""
    ran: set[str] = set()
    for block in blocks():
        if block.marker != "demo":
            continue
        for command in block.commands:
            if command.startswith("paritygate demo"):
                assert "--only lm" not in command, block.where
                continue
            if command in ran:  # the same command on another page
                continue
            proc = _paritygate(command, demo_folder)
            assert proc.returncode == 0, f"{block.where}: {command}\n{proc.stdout}{proc.stderr}"
            ran.add(command)
    assert len(ran) >= 3, ran


def _status_rows(text: str) -> list[tuple[str, str]]:
    return re.findall(r"^(\w+) +(pass|fail|skip|error)\b", text, re.M)


def test_ppo_walkthrough(tmp_path: Path) -> None:
    """``docs/ppo-in-five-minutes.md`` followed as written: each titled block is the file it
    names, each ``ppo`` block runs in order with exit 0, and the outputs it shows are what the
    commands print (the init lines exactly; the run's table by check and status)."""
    pytest.importorskip("stable_baselines3")
    page = DOCS / "ppo-in-five-minutes.md"
    sequence = blocks((page,))
    outputs: list[tuple[str, str]] = []
    for block in sequence:
        title = re.search(r'title="([^"]+)"', block.attrs)
        if title:
            target = tmp_path / title.group(1)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.body, encoding="utf-8")
        elif block.marker == "ppo":
            for line in block.body.splitlines():
                line = line.split(" #", 1)[0].strip()
                if line.startswith("python "):
                    proc = subprocess.run([sys.executable, *shlex.split(line)[1:]], cwd=tmp_path,
                                          capture_output=True, text=True, timeout=600)
                elif line:
                    proc = _paritygate(line, tmp_path)
                else:
                    continue
                assert proc.returncode == 0, f"{line}\n{proc.stdout}{proc.stderr}"
                outputs.append((line, proc.stdout + proc.stderr))
        elif block.lang == "text" and outputs:
            command, printed = outputs[-1]
            if command.startswith("paritygate init"):
                shown = block.body.strip().splitlines()
                lines = printed.splitlines()
                assert shown == [ln for ln in lines if ln.startswith("paritygate init")]
            elif command.startswith("paritygate run"):
                assert _status_rows(block.body) == _status_rows(printed)
    assert [c.split()[1] for c, _ in outputs if c.startswith("paritygate")] == [
        "init", "export", "run", "run"]
    assert (tmp_path / "golden" / "ppo-cartpole" / "rollout_parity.json").is_file()


def test_readme_failing_report_is_real(demo_folder: Path, tmp_path: Path) -> None:
    """The README's failing report is what the gate prints for the demo policy's checkpoint
    saved from a DistributedDataParallel wrapper: its root-cause line, each check's status, and
    report.json's root cause (kind, finding, explains, fix)."""
    import json

    from safetensors.torch import load_file, save_file

    work = tmp_path / "work"
    shutil.copytree(demo_folder, work)
    tensors = load_file(str(work / "policy" / "policy.safetensors"))
    ddp = {f"module.{k}": v for k, v in tensors.items()}  # what DDP's state_dict() saves
    save_file(ddp, str(work / "policy" / "ddp.safetensors"))
    config = yaml.safe_load((work / "configs" / "demo-policy.yaml").read_text(encoding="utf-8"))
    config["policy"]["checkpoint"] = "../policy/ddp.safetensors"
    config["golden"]["baseline"] = "demo-policy"
    (work / "configs" / "demo-ddp.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    proc = _paritygate("paritygate run configs/demo-ddp.yaml --report-dir reports/demo-ddp", work)
    assert proc.returncode == 1, proc.stdout + proc.stderr

    text = README.read_text(encoding="utf-8")
    section = text[text.index("## A failing report"):]
    shown = re.search(r"```text\n(.*?)```", section, re.S)
    assert shown is not None
    root_line = next(ln for ln in shown.group(1).splitlines() if ln.startswith("root cause:"))
    assert root_line in proc.stdout.splitlines()
    assert _status_rows(shown.group(1)) == _status_rows(proc.stdout)
    assert "status: fail   reports: reports/demo-ddp" in shown.group(1)

    block = re.search(r"```json\n(.*?)```", section, re.S)
    assert block is not None
    documented = json.loads("{" + block.group(1) + "}")["root_cause"]
    real = json.loads((work / "reports" / "demo-ddp" / "report.json").read_text())["root_cause"]
    for key in ("check", "kind", "finding", "explains", "fix"):
        assert documented[key] == real[key], key
    assert real["message"].startswith(documented["message"].removesuffix(" ..."))
