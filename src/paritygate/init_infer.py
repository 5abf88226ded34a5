"""What ``paritygate init`` infers from names around a checkpoint: the gate's name, the
training-only heads, the import folders and the ignore entries the gate's outputs need.

Pure path and string logic (no torch, no file contents beyond ``.gitignore``), shared by the
policy and the Hugging Face parts of init.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

TODO = "TODO"
"""Values starting with this marker are unfilled; ``load_config`` rejects them."""

_HEAD_WORDS = ("value", "critic", "aux", "v_head", "vf_", "q_head", "baseline", "reward_head")
"""Module-name starts that usually mark training-only heads (PPO critics, auxiliary losses)."""
_Q_NETWORK = re.compile(r"(target_)?(qf\d*|q\d+|q_?net\w*)(_target)?")
"""Module names of SAC / TD3 Q-networks (CleanRL's ``qf1``, ``qf2``; ``q1``, ``qnet``)."""
_TARGET = re.compile(r"(target_\w+|\w+_target|target)")
"""Module names of target networks (``q_net_target``, ``actor_target``, ``target_network``):
training-only copies the policy lags behind."""
_ATTENTION_WORDS = ("attn", "attention")
"""Parts of a module name that mark an attention block: nothing inside one is a head."""
_ATTENTION_PROJECTIONS = frozenset({"query", "key", "q", "k", "q_proj", "k_proj", "qk"})
"""Query/key projections: a ``value`` beside them is the attention's value projection."""

_GENERIC_WORDS = frozenset({
    "step", "steps", "iter", "iters", "iteration", "epoch", "ep", "it", "global", "update",
    "updates", "k", "m", "ckpt", "ckpts", "checkpoint", "checkpoints", "model", "models",
    "weights", "weight", "state", "dict", "pytorch", "torch", "rl", "final", "latest", "last",
    "best", "run", "runs", "output", "outputs", "out", "save", "saved", "export", "exports",
    "artifacts", "tmp", "configs", "config", "gate",
})  # fmt: skip
"""Words that name a training step or a storage folder, not a policy: a file or folder
named only by these (and numbers), such as ``step_300`` or ``checkpoints``, names no gate."""

OBTAINED_PATTERN = "*.obtained.json"
"""What a failing run writes beside the golden baselines (never to be committed)."""


def find_todos(data: Any, prefix: str = "") -> list[str]:
    """Dotted keys of every value in a parsed config that still starts with ``TODO``."""
    found: list[str] = []
    if isinstance(data, dict):
        for key, value in data.items():
            found += find_todos(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            found += find_todos(value, f"{prefix}[{i}]")
    elif isinstance(data, str) and data.strip().upper().startswith(TODO):
        found.append(prefix)
    return found


def head_prefixes(keys: list[str]) -> list[str]:
    """Likely training-only heads: the shortest module prefix whose last part looks like one.

    A head hangs off the model beside its trunk. The value projection of an attention block
    (``attention.self.value`` beside ``query`` and ``key``) shares the word but is part of the
    trunk: a part inside an attention module (an enclosing part naming ``attn``/``attention``)
    or beside query/key projections is never proposed. A target network (``*_target``,
    ``target_*``) always is; a Q-network only beside an actor: without one (DQN's ``q_net``) the
    Q-network is the policy."""
    top = {key.split(".")[0].lower() for key in keys}
    has_actor = any(not (_Q_NETWORK.fullmatch(p) or _TARGET.fullmatch(p)
                         or p.startswith(_HEAD_WORDS)) for p in top)
    children: dict[str, set[str]] = {}
    for key in keys:
        parts = key.split(".")
        for depth in range(1, len(parts)):
            children.setdefault(".".join(parts[: depth - 1]), set()).add(parts[depth - 1].lower())
    heads: list[str] = []
    for key in keys:
        parts = key.split(".")
        for depth in range(1, len(parts)):
            part = parts[depth - 1].lower()
            target = bool(_TARGET.fullmatch(part))
            q_head = bool(_Q_NETWORK.fullmatch(part)) and has_actor
            if not part.startswith(_HEAD_WORDS) and not q_head and not target:
                continue
            enclosing = [part.lower() for part in parts[: depth - 1]]
            siblings = children[".".join(parts[: depth - 1])]
            if any(word in part for part in enclosing for word in _ATTENTION_WORDS) or (
                siblings & _ATTENTION_PROJECTIONS
            ):
                continue
            prefix = ".".join(parts[:depth])
            if prefix not in heads:
                heads.append(prefix)
            break
    return heads


def relative(path: Path, base: Path) -> str:
    """``path`` relative to ``base`` in POSIX form (configs name paths relative to themselves)."""
    return Path(os.path.relpath(path.resolve(), base.resolve())).as_posix()


def _clean(raw: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", raw).strip("-.") or "my-policy"
    return cleaned if cleaned[0].isalnum() else f"g{cleaned}"


def names_a_policy(part: str) -> bool:
    """Whether a file stem or folder name says which policy it holds: ``ppo_cartpole`` does;
    ``step_300``, ``checkpoint-500``, ``rl_model_100000_steps`` and ``ckpt`` do not."""
    words = [w for w in re.split(r"[^a-z]+", part.lower()) if w]
    return any(w not in _GENERIC_WORDS for w in words)


def repository_root(start: Path) -> Path | None:
    """The nearest folder at or above ``start`` that holds a ``.git`` entry."""
    for folder in (start, *start.parents):
        if (folder / ".git").exists():
            return folder
    return None


def gate_name(source: Path, name: str | None, out: Path | None) -> tuple[str, str]:
    """The gate's name (it names ``golden/<name>/``) and where it came from.

    A name given (``--name``, or the stem of ``--out``) wins. Otherwise the policy names it,
    never the training step: the checkpoint's file stem if it names a policy, else the
    nearest enclosing folder that does (``runs/cartpole/step_300.safetensors`` ->
    ``cartpole``), searched up to the repository (or the folder init runs in), whose name is
    the last resort. The next checkpoint of the same policy then gates against the same
    baselines."""
    if name:
        return _clean(name), "--name"
    if out is not None and names_a_policy(out.stem):
        return _clean(out.stem), f"the config file name {out.name}"
    source = source.resolve()
    cwd = Path.cwd().resolve()
    stop = repository_root(source) or (cwd if source.is_relative_to(cwd) else None)
    parts: list[tuple[str, str]] = []
    if source.is_file():
        parts.append((source.stem, f"the checkpoint's file name {source.name}"))
    folder = source if source.is_dir() else source.parent
    for current in (folder, *folder.parents):
        what = "the repository" if current == stop else "the checkpoint's folder"
        parts.append((current.name, f"{what} {current.name}/"))
        if current == stop:
            break
    for part, reason in parts:
        if names_a_policy(part):
            return _clean(part), reason
    root = repository_root(cwd) or cwd
    if names_a_policy(root.name):
        return _clean(root.name), f"the repository {root.name}/"
    return "my-policy", "no file or folder names the policy"


def python_path(root: Path) -> tuple[list[Path], str]:
    """Folders that make the user's ``module:callable`` names importable without installing:
    ``root/src`` first when it holds a package or module (a src layout), and ``root``."""
    src = root / "src"
    if src.is_dir() and any(
        (p.is_dir() and (p / "__init__.py").is_file()) or p.suffix == ".py"
        for p in src.iterdir()
    ):
        return [src, root], "the src layout of the folder init ran in, and that folder"
    return [root], "the folder init ran in"


def _ignored(lines: list[str], wanted: str) -> bool:
    norm = {line.strip().strip("/").removesuffix("/**").removesuffix("/*") for line in lines}
    return wanted.strip("/") in norm or f"**/{wanted.strip('/')}" in norm


def gitignore_proposal(root: Path, reports: str = "reports/") -> tuple[Path, list[str]]:
    """The ``.gitignore`` (at the repository root, else ``root``) and the entries it lacks:
    the ``*.obtained.json`` a failing run writes beside the baselines, and the report folder.
    """
    target = (repository_root(root) or root) / ".gitignore"
    try:
        lines = target.read_text(encoding="utf-8").splitlines()
    except OSError:
        lines = []
    return target, [w for w in (OBTAINED_PATTERN, reports) if not _ignored(lines, w)]
