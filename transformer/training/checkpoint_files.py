"""The files of a checkpoint folder: checkpoints on the training's grid, and resume points.

``checkpoint_<step>.pt`` is written every ``checkpoint_every_steps`` updates and at the training's
end: these are the checkpoints kept (the newest ``keep_checkpoints``) and averaged (§6.1).
``checkpoint_<step>.resume.pt`` is a *resume point*: the state of a training stopped early (a
signal, or the ``max_minutes`` clock before ``max_steps``/``max_epochs``). It is off the grid, so
it is never listed among the checkpoints to keep or average, and it is deleted as soon as a later
checkpoint is written: a preempted and resumed training ends with the very files of an
uninterrupted one. There is at most one resume point.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

CHECKPOINT_PATTERN = re.compile(r"checkpoint_(\d+)\.pt$")
RESUME_POINT_PATTERN = re.compile(r"checkpoint_(\d+)\.resume\.pt$")


def checkpoint_name(step: int, resume_point: bool = False) -> str:
    return f"checkpoint_{step:08d}.resume.pt" if resume_point else f"checkpoint_{step:08d}.pt"


def checkpoint_step(path: str | os.PathLike) -> int:
    """The update a checkpoint or resume point was written after, from its name."""
    name = Path(path).name
    match = CHECKPOINT_PATTERN.search(name) or RESUME_POINT_PATTERN.search(name)
    if match is None:
        raise ValueError(f"{name} is not named as a checkpoint (checkpoint_<step>.pt)")
    return int(match.group(1))


def list_checkpoints(directory: str | os.PathLike, resume_points: bool = False) -> list[Path]:
    """Checkpoints in ``directory``, oldest (lowest step) first; with ``resume_points`` the
    resume points too, each after a checkpoint of the same step (both hold the same state)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        if match := CHECKPOINT_PATTERN.search(path.name):
            found.append((int(match.group(1)), 0, path))
        elif resume_points and (match := RESUME_POINT_PATTERN.search(path.name)):
            found.append((int(match.group(1)), 1, path))
    return [path for *_, path in sorted(found)]


def list_resume_points(directory: str | os.PathLike) -> list[Path]:
    """The resume points in ``directory`` (normally none or one), oldest first."""
    return [p for p in list_checkpoints(directory, resume_points=True) if RESUME_POINT_PATTERN.search(p.name)]


def prune(directory: str | os.PathLike, saved: Path, keep: int) -> None:
    """After ``saved`` was written: every other resume point goes, and with ``keep`` (a checkpoint
    on the grid was saved) all but the newest ``keep`` checkpoints."""
    for old in list_resume_points(directory):
        if old != saved:
            old.unlink(missing_ok=True)
    if keep:
        for old in list_checkpoints(directory)[:-keep]:
            old.unlink(missing_ok=True)


def remove_unfinished_writes(directory: str | os.PathLike) -> None:
    """The temporary files of checkpoint writes a kill cut short (``atomic``'s)."""
    directory = Path(directory)
    if directory.is_dir():
        for stale in directory.glob(".checkpoint_*.tmp"):
            stale.unlink(missing_ok=True)

