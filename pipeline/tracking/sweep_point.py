"""Whether a run is a sweep's point, and what it is tagged with: read from its environment.

A sweep's point runs with these variables set (``make sweep``; on a work pool, the point's flow run):
its MLflow run is tagged with them, and its model is logged but not registered (the sweep's winner
is, by ``make sweep-apply``). Environment, not params: they change nothing DVC makes.
"""

from __future__ import annotations

import os

SWEEP_VAR, POINT_VAR, OVERRIDES_VAR, EXPERIMENT_VAR = (
    "PIPELINE_SWEEP", "PIPELINE_SWEEP_POINT", "PIPELINE_SWEEP_OVERRIDES", "PIPELINE_SWEEP_EXPERIMENT")
SWEEP_TAGS = {SWEEP_VAR: "sweep", POINT_VAR: "sweep.point", OVERRIDES_VAR: "sweep.overrides",
              EXPERIMENT_VAR: "sweep.experiment"}


DVC_EXP_NAME = "DVC_EXP_NAME"   # DVC's: the experiment's name, in the stages of a queued experiment


def in_sweep() -> bool:
    """Whether this run is a sweep's point (its model is not registered)."""
    return bool(os.environ.get(SWEEP_VAR))


def point_experiment() -> str:
    """The DVC experiment this sweep point is: the pool's flow names it, DVC's queue tells its stages
    (a local sweep); "" outside a sweep."""
    if not in_sweep():
        return ""
    return os.environ.get(EXPERIMENT_VAR) or os.environ.get(DVC_EXP_NAME, "")


def sweep_tags() -> dict[str, str]:
    """``sweep``, ``sweep.point``, ``sweep.overrides`` (JSON) and ``sweep.experiment`` (the DVC
    experiment's name) of a sweep's point, from its environment; {} outside a sweep."""
    tags = {tag: os.environ[var] for var, tag in SWEEP_TAGS.items() if os.environ.get(var)}
    if point_experiment():
        tags[SWEEP_TAGS[EXPERIMENT_VAR]] = point_experiment()
    return tags
