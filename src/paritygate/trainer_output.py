"""Trainer output folders: find the ``checkpoint-N`` a gate runs on, and what step it is.

A Hugging Face ``Trainer`` (and TRL's ``GRPOTrainer``, ``PPOTrainer``...) writes its
``output_dir`` as ``checkpoint-N`` folders, each an HF model directory plus the trainer's own
files: ``trainer_state.json`` (JSON: the global step, the epoch, the log history) and
``optimizer.pt``, ``scheduler.pt``, ``rng_state*.pth``, ``scaler.pt``, ``training_args.bin``
(pickles). The gate reads ``trainer_state.json`` (as JSON) for the step; the pickles are listed
as present and never opened, so nothing a checkpoint holds runs as code.

A model directory in a gate config may be such an ``output_dir``: the latest ``checkpoint-N``
is gated unless ``causal_lm.checkpoint`` (or ``paritygate run --checkpoint``) picks another.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from paritygate.errors import InputError
from paritygate.reading import read_json_object

__all__ = [
    "BLESS_FIRST_ENV",
    "CHECKPOINT_ENV",
    "TrainerCheckpoint",
    "checkpoint_series",
    "find_checkpoints",
    "is_output_dir",
    "pick_checkpoint",
    "pin_output_dir",
    "resolve_checkpoint",
    "saved_zips",
]

CHECKPOINT_ENV = "PARITYGATE_CHECKPOINT"
"""``paritygate run --checkpoint`` travels to the pytest session (and its xdist workers) here."""

BLESS_FIRST_ENV = "PARITYGATE_BLESS_FIRST"
"""``paritygate run --bless-first``'s step and checkpoint (JSON) travel to the pytest session here,
to be recorded in the blessed baseline's provenance."""

CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")
TRAINER_FILES = (
    "trainer_state.json", "training_args.bin", "optimizer.pt", "scheduler.pt", "scaler.pt",
    "rng_state.pth",
)
"""Files a ``Trainer`` writes beside the model; only ``trainer_state.json`` is read (JSON)."""
SB3_SAVE = re.compile(r"^(?P<prefix>.+)_(?P<step>\d+)_steps\.zip$")
"""A Stable-Baselines3 ``CheckpointCallback`` save: ``<name_prefix>_<num_timesteps>_steps.zip``."""
_RNG_STATE = re.compile(r"^rng_state_\d+\.pth$")


@dataclass(frozen=True)
class TrainerCheckpoint:
    """The checkpoint a gate runs on, and what the trainer says about it."""

    path: Path
    """The model directory gated (``checkpoint-N``, or the output_dir's final model)."""
    output_dir: Path | None
    """The trainer output folder it was picked from (``None``: configured directly)."""
    step: int | None
    """The global step: ``trainer_state.json``'s ``global_step``, else the folder's N."""
    step_source: str
    epoch: float | None
    trainer_files: tuple[str, ...]
    """The trainer's files present in the checkpoint folder (never unpickled)."""
    steps: tuple[int, ...]
    """Every ``checkpoint-N`` of the output_dir, in step order (empty without one)."""
    chosen_by: str
    """Why this one: ``latest``, ``checkpoint: N``, ``--checkpoint PATH``..."""

    def to_json(self) -> dict[str, object]:
        return {
            "output_dir": str(self.output_dir) if self.output_dir is not None else None,
            "step": self.step,
            "step_source": self.step_source,
            "epoch": self.epoch,
            "trainer_files": list(self.trainer_files),
            "checkpoints": list(self.steps),
            "chosen_by": self.chosen_by,
        }

    def describe(self) -> str:
        """One phrase for notes and logs: ``checkpoint-6 (step 6, the latest of 2)``."""
        step = f"step {self.step}" if self.step is not None else "step unknown"
        where = f"{self.path.name} ({step}"
        if self.output_dir is not None:
            where += f", {self.chosen_by} of {len(self.steps)} in {self.output_dir.name}"
        return where + ")"


def find_checkpoints(output_dir: Path) -> list[tuple[int, Path]]:
    """``(N, folder)`` of every ``checkpoint-N`` folder, sorted by N."""
    try:
        entries = list(os.scandir(output_dir))
    except OSError:
        return []
    found = []
    for entry in entries:
        match = CHECKPOINT_DIR.match(entry.name)
        if match and entry.is_dir():
            found.append((int(match.group(1)), Path(entry.path)))
    return sorted(found)


def checkpoint_series(output_dir: Path) -> list[tuple[int, Path]]:
    """Every ``checkpoint-N`` of ``output_dir`` for ``run --all``, read before any is gated: each
    ``trainer_state.json`` (when present) must be readable JSON whose ``global_step`` is its
    folder's N, and the series must have no gap the trainer's ``save_steps`` (recorded in that
    file) says was saved and is gone. Bad input names the file (or the folder) and the key."""
    found = find_checkpoints(output_dir)
    save_steps: int | None = None
    for step, folder in found:
        state = _read_state(folder)  # unreadable: InputError naming trainer_state.json
        if state is None:
            continue
        path = folder / "trainer_state.json"
        recorded = state.get("global_step")
        if not isinstance(recorded, int) or isinstance(recorded, bool) or recorded != step:
            raise InputError(path, "global_step", f"{recorded!r} is not the step of its folder "
                             f"{folder.name}: the series is not one run's saves")
        every = state.get("save_steps")
        if isinstance(every, int) and not isinstance(every, bool) and every > 0:
            save_steps = every
    if save_steps is not None and len(found) > 1:
        steps = [n for n, _ in found]
        # the last save may be the end of training (max_steps), off the save_steps grid
        expected = range(steps[0], steps[-1], save_steps)
        missing = [n for n in expected if n not in steps]
        if missing:
            raise InputError(output_dir, f"checkpoint-{missing[0]}",
                             f"missing from the series (save_steps {save_steps} in "
                             f"trainer_state.json; saved: {_listing(tuple(steps))}): gate the "
                             "checkpoints present one at a time with --checkpoint N")
    return found


def saved_zips(checkpoint: Path, where: Path) -> list[tuple[int, Path]]:
    """``(step, zip)`` of a Stable-Baselines3 run's saves for ``run --all``, by step: every
    ``<prefix>_<N>_steps.zip`` in ``checkpoint`` (a folder), or beside it with its prefix (one
    save of the run). None found is bad input naming ``where`` (the config)."""
    named = SB3_SAVE.match(checkpoint.name)
    folder, prefix = (checkpoint, None) if checkpoint.is_dir() else (
        checkpoint.parent, named.group("prefix") if named else None)
    found = []
    with contextlib.suppress(OSError):
        if folder is not checkpoint and named is None:
            raise OSError  # neither a folder of saves nor one save of a run
        for entry in os.scandir(folder):
            match = SB3_SAVE.match(entry.name)
            if match and entry.is_file() and prefix in (None, match.group("prefix")):
                found.append((int(match.group("step")), Path(entry.path)))
    if not found:
        raise InputError(where, "--all", f"{checkpoint}: neither a trainer output_dir nor a "
                         "folder of CheckpointCallback saves (<prefix>_<N>_steps.zip)")
    return sorted(found)


def is_output_dir(path: Path) -> bool:
    """A trainer output folder: holds ``checkpoint-N`` folders, or the trainer's files but no
    model (a run that saved nothing yet)."""
    if not path.is_dir():
        return False
    if find_checkpoints(path):
        return True
    return not (path / "config.json").exists() and any(
        (path / name).exists() for name in ("trainer_state.json", "training_args.bin")
    )


def _trainer_files(folder: Path) -> tuple[str, ...]:
    names = {n for n in TRAINER_FILES if (folder / n).is_file()}
    with contextlib.suppress(OSError):
        names |= {e.name for e in os.scandir(folder) if _RNG_STATE.match(e.name)}
    return tuple(sorted(names))


def _read_state(folder: Path) -> dict[str, object] | None:
    path = folder / "trainer_state.json"
    if not path.is_file():
        return None
    return read_json_object(path, None, what="trainer state")


def _describe(
    folder: Path, output_dir: Path | None, steps: tuple[int, ...], chosen_by: str
) -> TrainerCheckpoint:
    state = _read_state(folder)
    match = CHECKPOINT_DIR.match(folder.name)
    step: int | None = int(match.group(1)) if match else None
    source = "folder name" if match else "none"
    epoch: float | None = None
    if state is not None:
        global_step = state.get("global_step")
        if isinstance(global_step, int) and not isinstance(global_step, bool):
            step, source = global_step, "trainer_state.json global_step"
        raw_epoch = state.get("epoch")
        if isinstance(raw_epoch, (int, float)) and not isinstance(raw_epoch, bool):
            epoch = float(raw_epoch)
    return TrainerCheckpoint(
        folder, output_dir, step, source, epoch, _trainer_files(folder), steps, chosen_by
    )


def resolve_checkpoint(
    source: Path, selector: int | str | None = None, *, key: str | None = None,
    where: Path | None = None,
) -> TrainerCheckpoint | None:
    """The checkpoint ``source`` names, or ``None`` for a plain model directory.

    ``source`` is a trainer output folder (``selector``: ``None``/``"latest"`` for the highest
    N, an int for ``checkpoint-N``, ``"final"`` for the model the trainer saved at the top), a
    ``checkpoint-N`` folder, or any other directory. Bad input names ``where`` (the config
    file, or ``source`` itself) and ``key``: an output folder without ``checkpoint-N``, a step
    that does not exist (the existing ones listed).
    """
    source = Path(source)
    named = f"{source}: " if where is not None else ""  # the error names the file otherwise
    found = find_checkpoints(source) if source.is_dir() else []
    steps = tuple(n for n, _ in found)
    if is_output_dir(source):
        if selector == "final":
            if not (source / "config.json").is_file():
                raise InputError(where or source, key,
                                 f"{named}no final model (config.json) in the output_dir; "
                                 f"its checkpoints: {_listing(steps)}")
            return _describe(source, source, steps, "final")
        if not found:
            raise InputError(where or source, key,
                             f"{named}trainer output_dir without checkpoint-N folders "
                             "(nothing saved yet, or save_strategy: 'no')")
        if selector in (None, "latest"):
            return _describe(found[-1][1], source, steps, "the latest")
        if not isinstance(selector, int):
            raise InputError(where or source, key,
                             f"expected a step number, 'latest' or 'final' (got {selector!r})")
        chosen = dict(found).get(selector)
        if chosen is None:
            raise InputError(where or source, key,
                             f"{named}no checkpoint-{selector}; its checkpoints: "
                             f"{_listing(steps)}")
        return _describe(chosen, source, steps, f"checkpoint: {selector}")
    if selector not in (None, "latest"):
        raise InputError(where or source, key,
                         f"{source} is not a trainer output_dir (no checkpoint-N folders), so "
                         f"there is no checkpoint {selector!r} to pick")
    if source.is_dir() and ((source / "trainer_state.json").is_file()
                            or CHECKPOINT_DIR.match(source.name)):
        parent = source.parent
        siblings = tuple(n for n, _ in find_checkpoints(parent))
        return _describe(source, None, siblings, "configured")
    return None


def _listing(steps: tuple[int, ...]) -> str:
    return ", ".join(f"checkpoint-{n}" for n in steps) or "none"


def pick_checkpoint(
    configured: str,
    *,
    key: str,
    override: str | None,
    base: Callable[[str], Path],
    where: Path,
    selector: int | str | None = None,
    earlier: TrainerCheckpoint | None = None,
    accepts_output_dir: bool = True,
) -> tuple[str | None, TrainerCheckpoint | None]:
    """The model path a config's ``configured`` value resolves to, and the trainer's record.

    ``override`` is ``paritygate run --checkpoint``'s value: a step number or ``latest`` /
    ``final`` (picked in the configured output_dir), or a path (relative to the current
    folder) to a checkpoint folder, an output_dir (its latest checkpoint) or, for a torch
    policy (``accepts_output_dir=False``), a checkpoint file. ``selector`` is the config's own
    ``checkpoint:`` pick, ``earlier`` the record of a resolution already made (its output_dir
    is reused), ``base`` resolves a config path, ``key`` names the config key in errors.
    Returns ``(None, None)`` when nothing changes.
    """
    new_value: str | None = None
    record: TrainerCheckpoint | None
    if override is not None and override.strip():
        override = override.strip()
        step: int | str | None = int(override) if override.isdigit() else (
            override if override in ("latest", "final") else None)
        if step is not None:
            if not accepts_output_dir:
                raise InputError(None, "--checkpoint", f"a step ({override}) needs a trainer "
                                 "output_dir; give the checkpoint file's path")
            start = earlier.output_dir if earlier is not None and earlier.output_dir else \
                base(configured)
            record = resolve_checkpoint(start, step, key="--checkpoint", where=where)
            if record is not None:
                record = _replace_choice(record, f"--checkpoint {override}")
        else:
            target = Path(override).expanduser().resolve()
            if not target.exists():
                raise InputError(target, "--checkpoint", "checkpoint not found")
            record = resolve_checkpoint(target, key="--checkpoint") if accepts_output_dir \
                else None
            if record is not None:
                record = _replace_choice(record, f"--checkpoint {override}"
                                         if record.output_dir is None else record.chosen_by)
            new_value = str(target)
    else:
        if not accepts_output_dir:
            return None, None
        record = resolve_checkpoint(base(configured), selector, key=key, where=where)
    if record is not None:
        new_value = str(record.path)
    return new_value, record


def _replace_choice(record: TrainerCheckpoint, chosen_by: str) -> TrainerCheckpoint:
    from dataclasses import replace

    return replace(record, chosen_by=chosen_by)


def pin_output_dir(
    text: str, record: TrainerCheckpoint, out: Path, selector: int | str | None
) -> str:
    """``paritygate init``'s config text for ``record.path`` rewritten to name the output_dir:
    ``model_dir`` is the output_dir (with ``checkpoint:`` for a causal LM), and paths into the
    inspected checkpoint fall back to their defaults (the gated checkpoint's own files)."""
    from paritygate.init_infer import relative

    assert record.output_dir is not None
    rel_ckpt = relative(record.path, out.parent)
    rel_out = relative(record.output_dir, out.parent)
    pick = selector if selector is not None else "latest"
    lines: list[str] = []
    text = text.replace(f"`paritygate init {record.path.name}`",
                        f"`paritygate init {record.output_dir.name}`")
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if rel_ckpt not in line:
            lines.append(line)
        elif key.strip() == "model_dir":
            indent = key[: len(key) - len(key.lstrip())]
            lines.append(f"{indent}model_dir: {rel_out}   # trainer output_dir, "
                         f"{len(record.steps)} checkpoint(s): {', '.join(map(str, record.steps))}")
            if "causal_lm:" in text:
                lines.append(f"{indent}checkpoint: {pick}   # the checkpoint-N gated: a step, "
                             f"latest or final (inspected: {record.path.name})")
        elif "TODO" in line:
            lines.append(line.replace(rel_ckpt, "the gated checkpoint"))
        else:
            lines.append(f"{key}: null   # default: the gated checkpoint's own "
                         f"({rest.split('#')[0].strip().replace(rel_ckpt, record.path.name)})")
    return "\n".join(lines) + ("\n" if text.endswith("\n") else "")
