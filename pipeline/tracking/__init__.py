"""MLflow: the one place that talks to the tracking store and the model registry, one module per
concern, so that a stage imports (and DVC reruns it for) only what it uses:

- ``store``: which store (``MLFLOW_TRACKING_URI`` or the embedded SQLite one), the client, experiments;
- ``tags``: what a run is tagged and named with (commit, data hashes, device);
- ``links``: a stage finds its run by the sha256 of the files it reads (nothing DVC hashes holds a run id);
- ``callback``: the trainer's hooks, one run per training;
- ``runs``: the later stages' records (the training run, or a child run when their params differ);
- ``unsent/``: the queue of what waits for the server (a training's buffered metrics, the stages'
  records) and what is set aside; ``replay``, its command (``python -m pipeline.tracking.replay``);
- ``failures``: what a failed call means (refused: stop; away: wait; otherwise: set aside);
- ``model_card``: what a registered version says about itself, and which version it already is;
- ``preflight``: before any stage runs, a tracking server's answer to the credentials given.

Imports none of them (nor MLflow) itself: ``enabled()`` tells a stage whether to record at all,
``check_credentials()`` stops it at its start when the server refuses its credentials.
"""

from __future__ import annotations

import os

TRACKING_ENV = "PIPELINE_TRACKING"
_OFF, _ON = ("0", "off", "false", "no"), ("", "1", "on", "true", "yes")


def enabled() -> bool:
    """Whether the stages record their runs in MLflow: yes unless ``PIPELINE_TRACKING`` is off.

    Off (``PIPELINE_TRACKING=off``), the stages do their work and write their outputs, byte for byte
    the same, without importing MLflow: for machines without it (a GPU box that only trains and
    measures) or a run nobody wants on record. A value other than on/off stops the stage (exit 2).
    """
    value = os.environ.get(TRACKING_ENV, "").strip().lower()
    if value in _OFF:
        return False
    if value in _ON:
        return True
    from pipeline.config.errors import ParamsError  # light: the errors alone, not the params schema

    raise ParamsError(f"{TRACKING_ENV}={value!r}: expected on or off (1/0, true/false, yes/no)")


def check_credentials() -> None:
    """At a tracking stage's start, before any work: a tracking server that refuses the environment's
    credentials (401/403) stops the stage with one line and exit 2 (``preflight.CredentialsRefused``,
    under ``dvc repro`` as under ``make run``); a server away is left to the unsent queue."""
    from pipeline.tracking.preflight import check_credentials as check

    check()
