"""Fill an ``init``-written config the way docs/init.md tells a user to, and run it.

The answers are edited through ruamel.yaml's round trip (what an editor does: each TODO value
replaced, every comment kept), never by matching lines of text. Every TODO must be answered and
nothing else: a TODO init should not have left, or one the answers miss, fails the test.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paritygate.init_infer import find_todos


@dataclass(frozen=True)
class Replace:
    """Replace the key itself: ``generator: "TODO..."`` becomes ``file: probes.npy``."""

    key: str
    value: object


def fill(config: Path, answers: dict[str, object]) -> None:
    """Answer every TODO of ``config`` (dotted keys, as ``find_todos`` names them)."""
    import yaml
    from ruamel.yaml import YAML

    text = config.read_text(encoding="utf-8")
    assert sorted(find_todos(yaml.safe_load(text))) == sorted(answers), (
        find_todos(yaml.safe_load(text)), sorted(answers))
    rt = YAML()
    rt.width = 4096
    rt.indent(mapping=2, sequence=4, offset=2)
    data = rt.load(text)
    for dotted, value in answers.items():
        *parents, last = dotted.split(".")
        node: Any = data
        for part in parents:
            node = node[part]
        if isinstance(value, Replace):
            position = list(node).index(last)
            del node[last]
            node.insert(position, value.key, value.value)
        else:
            node[last] = value
    with config.open("w", encoding="utf-8") as fh:
        rt.dump(data, fh)
    filled = config.read_text(encoding="utf-8")
    assert find_todos(yaml.safe_load(filled)) == []
    assert filled.startswith("# Gate config written by `paritygate init"), filled[:200]
    assert filled.count("#") >= text.count("\n#") // 2  # the comments survive the edit


def run_cli(args: list[str], cwd: Path, capfd: Any) -> tuple[int, str, str]:
    """``paritygate ARGS`` in this process (no interpreter start per run), from ``cwd``."""
    import os
    import sys

    from paritygate import cli

    before, path, here = set(sys.modules), list(sys.path), os.getcwd()
    saved = {k: os.environ.pop(k) for k in ("GITHUB_STEP_SUMMARY", "PARITYGATE_CONFIG")
             if k in os.environ}
    capfd.readouterr()
    try:
        os.chdir(cwd)
        code = cli.main(args)
    finally:
        os.chdir(here)
        sys.path[:] = path
        os.environ.update(saved)
        for name in set(sys.modules) - before:  # the user's modules imported from cwd
            file = getattr(sys.modules[name], "__file__", None) or ""
            if file.startswith(str(cwd)):
                del sys.modules[name]
    out, err = capfd.readouterr()
    return code, out, err
