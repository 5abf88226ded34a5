"""The bundled demo: checkpoints built on the spot, with the gate configs and golden to run them.

``paritygate demo --out DIR`` builds ``DIR/policy``, ``DIR/lm`` and ``DIR/rollout`` (a
CartPole policy for ``rollout_parity``) and writes
``DIR/configs`` (gate and sampling configs; ``demo-rl-loop`` gates the reward model and KL
reference built beside the demo LM) and ``DIR/golden`` (blessed baselines
and probe sets) beside them, so ``paritygate run DIR/configs/demo-policy.yaml``
works from any directory. The configs and golden ship inside the wheel
(``paritygate/demo/configs``, ``paritygate/demo/golden``); in a source checkout
they are the repository's ``configs/`` and ``golden/``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

DEMOS: dict[str, str] = {"policy": "demo-policy", "lm": "demo-lm", "rollout": "demo-rollout"}
"""Demo part (``paritygate demo --only``) -> gate name."""

MORE_GATES: dict[str, tuple[str, ...]] = {"lm": ("demo-rl-loop",)}
"""Demo part -> the further gates written with it (the RL loop around the demo LM)."""

_REPO_ROOT = Path(__file__).resolve().parents[3]


def resource_dir(kind: str) -> Path:
    """The shipped ``configs`` or ``golden`` folder: in the wheel, else the source checkout's."""
    packaged = Path(__file__).resolve().parent / kind
    if packaged.is_dir():
        return packaged
    checkout = _REPO_ROOT / kind
    if checkout.is_dir():
        return checkout
    raise FileNotFoundError(f"paritygate's demo {kind} are missing from this installation")


def demo_config_text(name: str) -> str:
    """The demo gate config ``name``, with checkpoint paths pointing beside ``configs/``.

    The repository's configs reach the checkpoints through ``../demo/``
    (``paritygate demo --out demo`` at the repository root); the written copy sits in
    ``OUT/configs`` beside ``OUT/policy`` and ``OUT/lm``, so ``../demo/`` becomes ``../``.
    """
    text = (resource_dir("configs") / f"{name}.yaml").read_text(encoding="utf-8")
    return text.replace("../demo/", "../")


def write_bundle(out: Path, parts: list[str]) -> dict[str, Path]:
    """Write the configs, sampling configs and golden of the demo ``parts`` into ``out``.

    Returns ``{gate name: config path}``. Existing files are replaced (the demo is rebuilt).
    """
    configs = out / "configs"
    configs.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    for name in [n for part in parts for n in (DEMOS[part], *MORE_GATES.get(part, ()))]:
        path = configs / f"{name}.yaml"
        path.write_text(demo_config_text(name), encoding="utf-8")
        written[name] = path
        source = resource_dir("golden") / name
        target = out / "golden" / name
        target.mkdir(parents=True, exist_ok=True)
        for item in sorted(source.iterdir()):
            if item.is_file() and not item.name.endswith(".obtained.json"):
                shutil.copyfile(item, target / item.name)
    if "lm" in parts:
        sampling = configs / "sampling"
        sampling.mkdir(exist_ok=True)
        for item in sorted((resource_dir("configs") / "sampling").glob("demo-*.yaml")):
            shutil.copyfile(item, sampling / item.name)
    return written
