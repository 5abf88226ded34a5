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
    "CHECKPOINT_ENV",
    "TrainerCheckpoint",
    "find_checkpoints",
    "is_output_dir",
    "pick_checkpoint",
    "resolve_checkpoint",
]

CHECKPOINT_ENV = "PARITYGATE_CHECKPOINT"
"""``paritygate run --checkpoint`` travels to the pytest session (and its xdist workers) here."""

CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")
TRAINER_FILES = (
    "trainer_state.json", "training_args.bin", "optimizer.pt", "scheduler.pt", "scaler.pt",
    "rng_state.pth",
)
"""Files a ``Trainer`` writes beside the model; only ``trainer_state.json`` is read (JSON)."""
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
