"""Whose checkpoints lie in a worker's workspace.

A worker's workspace serves every flow run it takes: the retraining and the points of sweeps. The
train stage resumes from whatever ``models/checkpoints`` holds when its settings match and deletes
it when they do not, so before each run the checkpoints of another run move aside, under
``.dvc/tmp/sweep-checkpoints/<owner>``, and that run's own come back: a point crashed mid-training
resumes when it returns to this worker, whatever ran here in between.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from transformer.atomic import write_text

RETRAINING = "workspace"   # the owner of the retraining's checkpoints, and of any left by no sweep


CHECKPOINTS = Path("models/checkpoints")
KEPT = Path(".dvc/tmp/sweep-checkpoints")     # git-ignored (.dvc/.gitignore), never pushed
OWNER = KEPT / "owner"                        # whose checkpoints CHECKPOINTS holds (none: RETRAINING)


def _has_files(folder: Path) -> bool:
    return folder.is_dir() and any(folder.iterdir())


def take_checkpoints(root: Path, name: str) -> str:
    """Put the checkpoints of ``name`` (a point's experiment, or ``RETRAINING``) in place: another's
    move aside under ``KEPT/<its name>``, this one's come back from there. Each step is a rename, in an order a
    crash at any point of leaves resumable. Says what it did."""
    current, kept = root / CHECKPOINTS, root / KEPT
    owner_file = root / OWNER
    owner = owner_file.read_text().strip() if owner_file.is_file() else RETRAINING
    said = []
    if owner != name and _has_files(current):
        shutil.rmtree(kept / owner, ignore_errors=True)
        kept.mkdir(parents=True, exist_ok=True)
        current.rename(kept / owner)
        said.append(f"the checkpoints of {owner} kept aside")
    if owner != name:
        if name == RETRAINING:
            owner_file.unlink(missing_ok=True)
        else:
            write_text(owner_file, name + "\n")
    if _has_files(kept / name) and not _has_files(current):
        shutil.rmtree(current, ignore_errors=True)
        current.parent.mkdir(parents=True, exist_ok=True)
        (kept / name).rename(current)
        said.append(f"the checkpoints {name} left here restored")
    return "; ".join(said) or "no checkpoints to move"


def drop_checkpoints(root: Path) -> None:
    """A pushed point's checkpoints are on the remote: none stays for the next point to resume from
    by mistake (the same training settings would continue this point's MLflow run), and the folder
    is the workspace's (the retraining's) again."""
    shutil.rmtree(root / CHECKPOINTS, ignore_errors=True)
    (root / OWNER).unlink(missing_ok=True)
