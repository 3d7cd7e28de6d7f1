"""DVC stage ``average``: average the last N checkpoints into one model (§6.1)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from pipeline import tracking
from pipeline.config import paths
from pipeline.config.average import AverageParams
from pipeline.config.errors import ParamsError
from pipeline.config.loader import Sections, load_sections
from pipeline.config.tracking import TrackingParams
from pipeline.stages.runner import run_stage
from pipeline.text.names import CHECKPOINT_KEY as TEXT_FORM_KEY
from pipeline.text.names import text_form_of
from transformer.checkpoint import average_checkpoints, file_sha256, load_checkpoint, save_checkpoint
from transformer.training.checkpoint_files import list_checkpoints


def average(last_n: int) -> dict[str, Any]:
    """The averaged model checkpoint of the newest ``last_n`` checkpoints; a warning on stderr when
    there are fewer (a short run: ``train.max_steps`` below ``train.checkpoint_every_steps`` x
    ``last_n``, or ``train.keep_checkpoints`` below ``last_n``)."""
    checkpoints = list_checkpoints(paths.CHECKPOINT_DIR)
    if not checkpoints:
        raise ParamsError(f"no checkpoints in {paths.CHECKPOINT_DIR}: run the train stage first")
    if len(checkpoints) < last_n:
        print(f"warning: average.last_n is {last_n} but {paths.CHECKPOINT_DIR} holds {len(checkpoints)} "
              f"checkpoint(s): averaging {len(checkpoints)} (the run wrote fewer; see train.max_steps, "
              "train.checkpoint_every_steps and train.keep_checkpoints)", file=sys.stderr)
    averaged = average_checkpoints(checkpoints[-last_n:])
    # The text form the model reads (pipeline.text.forms), kept where training stored one: its readers
    # prepare their input by it. The newest checkpoint's: a change of data restarts training.
    form = text_form_of(load_checkpoint(checkpoints[-1]), str(checkpoints[-1]))
    return averaged if form.is_raw else {**averaged, TEXT_FORM_KEY: form.entry()}


def record(params: Sections, averaged: dict[str, Any], seconds: float) -> None:
    """Log the averaging into the training run (or a child run when ``average`` params changed) and
    link that run to the averaged model's sha256, where tune and evaluate find it."""
    from pipeline.tracking.unsent import deferred
    from pipeline.tracking.unsent.records import average as sender

    section = {k: v for k, v in params.flat().items() if k.startswith("average.")}
    # The training run: the one that tagged the newest averaged checkpoint as its own. Sent now, or
    # kept in the unsent queue while the tracking server is away (pipeline.tracking.unsent.records.average).
    deferred.submit(sender, {
        "experiment": params.tracking.experiment, "section": section,
        "checkpoint_sha256": file_sha256(averaged["averaged_from"][-1]),
        "model_sha256": file_sha256(paths.AVERAGED_MODEL), "timestamp": int(time.time() * 1000),
        "metrics": {"time/average_seconds": seconds, "average/checkpoints_used": len(averaged["averaged_from"])}})


def main() -> None:
    argparse.ArgumentParser(description=__doc__).parse_args()
    params = load_sections(AverageParams, TrackingParams)
    record_run = tracking.enabled()
    if record_run:
        tracking.check_credentials()   # 401/403: one line and exit 2, before any work
    start = time.monotonic()
    averaged = average(params.average.last_n)
    save_checkpoint(paths.AVERAGED_MODEL, averaged)
    print(f"averaged {len(averaged['averaged_from'])} checkpoint(s) into {paths.AVERAGED_MODEL}: "
          f"{', '.join(averaged['averaged_from'])}")
    if record_run:
        record(params, averaged, time.monotonic() - start)


if __name__ == "__main__":
    run_stage(main)
