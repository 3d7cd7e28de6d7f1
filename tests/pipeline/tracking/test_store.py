"""pipeline/tracking/store.py: the experiment's id when two processes create it at once (a real
MLflow store, SQLite)."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from pipeline.tracking.store import experiment_id

pytestmark = pytest.mark.fast


class LateLookup(MlflowClient):
    """A client whose first lookup finds nothing because another worker's creation lands right after it."""

    def __init__(self, uri: str, other: MlflowClient, name: str) -> None:
        super().__init__(uri, uri)
        self.other, self.name, self.looked = other, name, 0

    def get_experiment_by_name(self, name: str):
        self.looked += 1
        if self.looked == 1:
            self.other.create_experiment(self.name)   # the other worker wins the race
            return None
        return super().get_experiment_by_name(name)


def test_a_creation_lost_to_another_process_returns_the_winners_experiment(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    other = MlflowClient(uri, uri)
    late = LateLookup(uri, other, "sweep")
    got = experiment_id("sweep", late)
    assert got == other.get_experiment_by_name("sweep").experiment_id and late.looked == 2
    assert experiment_id("sweep", MlflowClient(uri, uri)) == got   # found at once afterwards
    assert len([e for e in other.search_experiments() if e.name == "sweep"]) == 1

