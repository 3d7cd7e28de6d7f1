"""pipeline/tracking/links.py: a run found by the content of the file it made, within a pool sweep's
point when the stage runs as one (a real MLflow store, SQLite)."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from pipeline.tracking.links import LINK_CHECKPOINT, lookup_run, point_scope
from pipeline.tracking.sweep_point import DVC_EXP_NAME, EXPERIMENT_VAR, SWEEP_VAR

pytestmark = pytest.mark.fast

SHA = "ab" * 32


@pytest.fixture
def store(tmp_path, monkeypatch) -> MlflowClient:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return MlflowClient(uri, uri)


def test_two_points_that_trained_alike_each_find_their_own_run(store, monkeypatch):
    experiment = store.create_experiment("links")
    runs = {name: store.create_run(experiment, start_time=start, tags={LINK_CHECKPOINT: SHA,
                                                                       "sweep.experiment": name}).info.run_id
            for name, start in (("grid-p0", 1000), ("grid-p1", 2000))}    # p1 the newest
    for var in (SWEEP_VAR, EXPERIMENT_VAR, DVC_EXP_NAME):
        monkeypatch.delenv(var, raising=False)
    assert point_scope() == "" and lookup_run(LINK_CHECKPOINT, SHA, "links", store) == runs["grid-p1"]
    monkeypatch.setenv(DVC_EXP_NAME, "grid-p0")    # a DVC experiment outside a sweep (make run RECIPE=...)
    assert lookup_run(LINK_CHECKPOINT, SHA, "links", store) == runs["grid-p1"]
    monkeypatch.setenv(SWEEP_VAR, "grid")           # a local sweep: DVC's queue names the point
    assert lookup_run(LINK_CHECKPOINT, SHA, "links", store) == runs["grid-p0"]
    monkeypatch.setenv(EXPERIMENT_VAR, "grid-p2")   # a pool sweep: the point's flow names it
    assert lookup_run(LINK_CHECKPOINT, SHA, "links", store) is None
