"""pipeline/figures/curves.py: the curves' files, rewritten from a checkpoint's rows on resume."""

from __future__ import annotations

import pytest

from pipeline.figures.curves import CurveWriter

pytestmark = pytest.mark.fast

LOG = {"train/loss": 5.5, "train/ppl": 244.7, "train/lr": 1e-3, "train/epoch": 1.0,
       "train/target_tokens_per_s": 1234.0}


def test_a_resumed_writer_writes_the_checkpoints_rows_at_once(tmp_path):
    """A training resumed at its length logs nothing more, and DVC deleted the curves before the stage
    ran: the rows the checkpoint kept are the files again, byte for byte, without another log."""
    first = CurveWriter(tmp_path / "a" / "train.csv", tmp_path / "a" / "valid.csv", echo=False)
    first.on_log(20, LOG)
    first.on_validate(20, {"valid/loss": 5.4, "valid/ppl": 221.4})
    resumed = CurveWriter(tmp_path / "b" / "train.csv", tmp_path / "b" / "valid.csv", echo=False)
    resumed.restore(first.checkpoint_state())
    for name in ("train.csv", "valid.csv"):
        assert (tmp_path / "b" / name).read_bytes() == (tmp_path / "a" / name).read_bytes()
    assert (tmp_path / "b" / "train.csv").read_text() == "step,loss,ppl,lr,epoch\n20,5.5,244.7,0.001,1\n"


def test_a_fresh_or_empty_state_writes_nothing(tmp_path):
    writer = CurveWriter(tmp_path / "train.csv", tmp_path / "valid.csv", echo=False)
    writer.restore({})
    assert not (tmp_path / "train.csv").exists() and not (tmp_path / "valid.csv").exists()
