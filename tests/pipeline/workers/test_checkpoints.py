"""pipeline/workers/checkpoints.py: a worker's workspace keeps each unfinished run's checkpoints
apart (a sweep's points, the retraining), so that the run that comes back resumes from its own and
no other from them."""

from __future__ import annotations

import pytest

from pipeline.workers.checkpoints import CHECKPOINTS, KEPT, OWNER, RETRAINING, drop_checkpoints, take_checkpoints

pytestmark = pytest.mark.fast


def write_checkpoint(root, name: str) -> None:
    (root / CHECKPOINTS).mkdir(parents=True, exist_ok=True)
    (root / CHECKPOINTS / "checkpoint_00000020.pt").write_text(name)


def held(root) -> str:
    return (root / CHECKPOINTS / "checkpoint_00000020.pt").read_text()


def test_a_crashed_points_checkpoints_wait_aside_and_come_back_to_it(tmp_path):
    assert take_checkpoints(tmp_path, "grid-p1") == "no checkpoints to move"
    write_checkpoint(tmp_path, "grid-p1")                 # p1 crashed mid-training here
    said = take_checkpoints(tmp_path, "grid-p3")          # the worker takes another point
    assert "the checkpoints of grid-p1 kept aside" in said
    assert not (tmp_path / CHECKPOINTS).exists() and (tmp_path / KEPT / "grid-p1").is_dir()
    write_checkpoint(tmp_path, "grid-p3")
    drop_checkpoints(tmp_path)                            # p3 finished and was pushed
    said = take_checkpoints(tmp_path, "grid-p1")          # the rerun sends p1 back here
    assert said == "the checkpoints grid-p1 left here restored" and held(tmp_path) == "grid-p1"
    assert (tmp_path / OWNER).read_text() == "grid-p1\n"


def test_the_retrainings_checkpoints_move_aside_and_come_back_to_it(tmp_path):
    write_checkpoint(tmp_path, "retraining")              # a retraining stopped mid-training
    take_checkpoints(tmp_path, "grid-p0")
    assert (tmp_path / KEPT / RETRAINING).is_dir() and not (tmp_path / CHECKPOINTS).exists()
    write_checkpoint(tmp_path, "grid-p0")                 # the point crashed too
    assert take_checkpoints(tmp_path, "grid-p0") == "no checkpoints to move" and held(tmp_path) == "grid-p0"
    said = take_checkpoints(tmp_path, RETRAINING)         # the retraining runs again here
    assert said == ("the checkpoints of grid-p0 kept aside; the checkpoints workspace left here restored")
    assert held(tmp_path) == "retraining" and not (tmp_path / OWNER).exists()
    write_checkpoint(tmp_path, "retraining")
    drop_checkpoints(tmp_path)
    assert take_checkpoints(tmp_path, "grid-p0") == "the checkpoints grid-p0 left here restored"


def test_a_crash_between_the_steps_leaves_it_resumable(tmp_path):
    """The owner is written after the old checkpoints moved and before this point's come back: a crash
    between any two steps, then the same call again, ends as one call would."""
    (tmp_path / KEPT / "grid-p1").mkdir(parents=True)
    (tmp_path / KEPT / "grid-p1" / "checkpoint_00000020.pt").write_text("grid-p1")
    (tmp_path / OWNER).write_text("grid-p1\n")            # crashed after writing the owner
    assert take_checkpoints(tmp_path, "grid-p1") == "the checkpoints grid-p1 left here restored"
    assert held(tmp_path) == "grid-p1"
