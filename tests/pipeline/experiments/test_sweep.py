"""pipeline/experiments/sweep.py: params/sweep.yaml validated against params.yaml's schema, the grid queued with
DVC's own syntax and run by DVC's queue; a real 2-point sweep lands in MLflow and `compare` ranks it."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import mlflow
import pandas as pd
import pytest
import yaml

from pipeline.experiments import sweep
from pipeline.experiments.compare import RANK_METRIC
from tests.pipeline.conftest import BIN, REPO, TINY, make_workspace, needs_mirror, tiny_params

pytestmark = pytest.mark.fast

RUN = ["exp", "run", "--run-all", "-j", "1"]


def write_sweep(root: Path, doc: dict) -> Path:
    path = root / "params" / "sweep.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_repository_sweep_file_is_valid():
    loaded = sweep.load_sweep(REPO / "params" / "sweep.yaml", REPO / "params.yaml")
    assert loaded.points() and loaded.top >= 1
    assert "train.max_minutes" in loaded.proxy


@pytest.mark.parametrize("doc, message", [
    ({"grid": {"train.lr_scal": [0.4]}}, "unknown key train.lr_scal"),
    ({"grid": {"trainer.lr_scale": [0.4]}}, "unknown key trainer.lr_scale"),
    ({"grid": {"lr_scale": [0.4]}}, "grid key 'lr_scale' is not a params.yaml key"),
    ({"grid": {"train.max_tokens": [1024, -5]}}, "train.max_tokens"),
    ({"grid": {"train.lr_scale": [0.4]}, "proxy": {"train.max_minutez": 3}}, "unknown key train.max_minutez"),
    ({"grid": {"train.lr_scale": [0.4, 0.4]}}, "lists a value twice"),
    ({"grid": {"train.lr_scale": [0.4]}, "proxy": {"train.lr_scale": 1.0}}, "both in grid and in proxy"),
    ({"grid": {"train.lr_scale": [0.4]}, "top": 0}, "top must be a positive integer"),
])
def test_a_bad_sweep_file_is_refused_naming_the_key(project, doc, message):
    path = write_sweep(project, doc)
    with pytest.raises(sweep.SweepError, match=message.replace("(", r"\(")):
        sweep.load_sweep(path, project / "params.yaml")
    assert list(project.glob(".sweep-check-*")) == []   # the validation's temporary params file is gone


def test_a_bad_key_stops_the_command_with_one_line(project):
    write_sweep(project, {"grid": {"train.lr_scal": [0.4]}})
    result = subprocess.run([sys.executable, "-m", "pipeline.experiments.sweep", "--dry-run"], cwd=project,
                            capture_output=True, text=True, env={"PYTHONPATH": str(REPO), "PATH": str(BIN)})
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("error: params/sweep.yaml: unknown key train.lr_scal (known: ")
    assert result.stderr.count("\n") == 1


def test_ranks_by_the_metric_compare_ranks_by():
    assert sweep.RANK_METRIC == RANK_METRIC == "valid_bleu"


def test_overrides_use_dvc_grid_syntax():
    raw = {"train": {"lr_scale": 0.6}, "model": {"preset": "tiny"}, "data": {"test_sets": ["a"]}}
    assert sweep.set_param("train.lr_scale", [0.4, 0.6, 1.0], raw) == "train.lr_scale=0.4,0.6,1.0"
    assert sweep.set_param("model.d_model", [64, 128], raw) == "+model.d_model=64,128"  # new key for Hydra
    assert sweep.set_param("data.test_sets", [["a", "b"]], raw) == "data.test_sets=[a,b]"
    assert sweep.hydra_value(True) == "true" and sweep.hydra_value("1e-3") == "'1e-3'"
    assert sweep.hydra_value("a b,c") == "'a b,c'" and sweep.hydra_value("null") == "'null'"


def test_proxy_dry_run_prints_the_queue_commands(project, capsys):
    write_sweep(project, {"grid": {"train.lr_scale": [0.4, 0.9], "model.dropout": [0.1, 0.2]},
                          "proxy": {"train.max_minutes": 3}})
    with pytest.raises(SystemExit) as stop:
        sweep.main(["--phase", "proxy", "--dry-run"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert "proxy: 4 experiment(s)" in out
    queue = next(line for line in out.splitlines() if "--queue" in line)
    assert queue.startswith("dvc exp run --queue -n proxy-")
    # model.dropout is not in params.yaml (the preset sets it): Hydra's + adds the key
    assert queue.endswith("-S train.lr_scale=0.4,0.9 -S +model.dropout=0.1,0.2 -S train.max_minutes=3")
    assert "dvc " + " ".join(RUN) in out


def test_finalists_are_the_best_proxy_points_by_validation_bleu():
    nan = float("nan")
    runs = pd.DataFrame([   # MLflow's strings for params; test BLEU in the opposite order of valid_bleu
        {"run_id": "a" * 32, "params.train.lr_scale": "0.4", "params.train.max_minutes": "3",
         "metrics.valid_bleu": 20.0, "metrics.test/t/bleu": 40.0},
        {"run_id": "b" * 32, "params.train.lr_scale": "0.9", "params.train.max_minutes": "3",
         "metrics.valid_bleu": 30.0, "metrics.test/t/bleu": 10.0},
        {"run_id": "c" * 32, "params.train.lr_scale": "0.9", "params.train.max_minutes": "19",   # a final run
         "metrics.valid_bleu": 35.0, "metrics.test/t/bleu": 12.0},
        {"run_id": "d" * 32, "params.train.lr_scale": "1", "params.train.max_minutes": "3",
         "metrics.valid_bleu": nan, "metrics.test/t/bleu": 50.0},
    ])
    points = [{"train.lr_scale": v} for v in (0.4, 0.9, 1.0, 1.5)]
    rows = sweep.point_scores(runs, points, {"train.max_minutes": 3})
    assert [r["point"]["train.lr_scale"] for r in rows] == [0.9, 0.4, 1.0, 1.5]   # unscored last, grid order
    assert [r[RANK_METRIC] for r in rows[:2]] == [30.0, 20.0] and [r["test_bleu"] for r in rows[:2]] == [10.0, 40.0]
    assert rows[0]["run"] == "b" * 32
    final = sweep.final_values(sweep.Sweep({"train.lr_scale": [0.9]}, {"train.max_minutes": 3}, {}, 1),
                               {"train": {"max_minutes": 19}})
    assert final == {"train.max_minutes": 19}
    assert sweep.point_scores(runs, [{"train.lr_scale": 0.9}], final)[0]["run"] == "c" * 32


# ----------------------------------------------------------------------------- a real sweep

SWEEP = {"grid": {"train.lr_scale": [0.5, 2.0]}, "proxy": {"train.max_minutes": 2}, "final": {}, "top": 1}
# The cheapest pipeline that still runs every stage: 6 updates, one decoding setting tuned on 50
# validation sentences, one attention plot.
CHEAP = {
    "train": {**TINY["train"], "max_steps": 6, "checkpoint_every_steps": 3, "validate_every": 6, "log_every": 3,
              "keep_checkpoints": 2, "max_minutes": 0},
    "average": {"last_n": 2},
    "evaluate": {**TINY["evaluate"], "max_len_b": 4, "batch_sentences": 512, "attention_sentences": 1},
}
if "tune" in yaml.safe_load((REPO / "params.yaml").read_text()):
    CHEAP["tune"] = {"beam_sizes": [1], "alphas": [0.6], "max_sentences": 50}


@pytest.mark.pipeline
@needs_mirror
@pytest.mark.slow
def test_a_two_point_sweep_runs_in_the_dvc_queue_and_compare_ranks_it_by_validation(tmp_path):
    root, env = make_workspace(tmp_path / "repo", tiny_params(CHEAP))
    shutil.copy(REPO / ".gitignore", root / ".gitignore")   # the MLflow store stays out of the experiments
    write_sweep(root, SWEEP)
    for cmd in (["git", "add", "-A"], ["git", "commit", "-qm", "sweep"]):
        subprocess.run(cmd, cwd=root, env=env, check=True, capture_output=True)
    env.pop("MLFLOW_TRACKING_URI")   # sweep.py points the queued copies at the repository's own store

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", *args], cwd=root, env=env, capture_output=True, text=True,
                              timeout=400)

    result = run("pipeline.experiments.sweep", "--phase", "proxy")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "$ dvc exp run --queue -n proxy-" in result.stdout
    assert "-S train.lr_scale=0.5,2.0 -S train.max_minutes=2" in result.stdout
    assert "$ dvc " + " ".join(RUN) in result.stdout

    # Both experiments ran from DVC's queue.
    shown = json.loads(subprocess.run([str(BIN / "dvc"), "exp", "show", "--json"], cwd=root, env=env,
                                      capture_output=True, text=True, check=True).stdout)
    exps = {e["name"]: e for b in shown for e in b.get("experiments") or []}
    assert len(exps) == 2 and all(name.startswith("proxy-") for name in exps)
    assert {e["executor"]["state"] for e in exps.values()} == {"success"}
    swept = sorted(e["revs"][0]["data"]["params"]["params.yaml"]["data"]["train"]["lr_scale"] for e in exps.values())
    assert swept == [0.5, 2.0]

    # Both are in the repository's MLflow store with their swept values and the proxy's cap.
    # Both URIs: an earlier test in this process may have left mlflow's registry URI on its own store.
    mlflow.set_tracking_uri(f"sqlite:///{root / 'mlflow.db'}")
    mlflow.set_registry_uri(f"sqlite:///{root / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=[TINY["tracking"]["experiment"]])
    assert sorted(runs["params.train.lr_scale"].astype(float)) == [0.5, 2.0]
    assert set(runs["params.train.max_minutes"]) == {"2"}
    assert (runs["status"] == "FINISHED").all()
    assert all(Path(uri.removeprefix("file://")).is_relative_to(root / "mlartifacts") for uri in runs["artifact_uri"])
    # Tagged with the sweep's name, the one the command printed; their models logged, none registered.
    name = result.stdout.split("$ dvc exp run --queue -n ")[1].split()[0]
    assert set(runs["tags.sweep"]) == {name} and f"make compare SWEEP={name}" in result.stdout
    assert runs["tags.translator.unregistered"].notna().all()
    assert mlflow.MlflowClient().search_model_versions(f"name = '{TINY['tracking']['registered_model']}'") == []

    # compare ranks by the validation metric, never by test BLEU; --sweep: the same runs, this sweep's.
    result = run("pipeline.experiments.compare", "--sweep", name)
    assert result.returncode == 0, result.stderr
    assert f"`{RANK_METRIC} (ranks)` ranks" in result.stdout
    rows = [line.split("|")[1:-1] for line in (root / "reports/compare.md").read_text().splitlines()
            if line.startswith("|")]
    header, rows = [c.strip() for c in rows[0]], rows[2:]
    assert len(rows) == 2
    ranked = [float(r[header.index(f"{RANK_METRIC} (ranks)")]) for r in rows]
    if RANK_METRIC in {c[len("metrics."):] for c in runs.columns if c.startswith("metrics.")} \
            and runs[f"metrics.{RANK_METRIC}"].notna().all():
        assert ranked == sorted(ranked, reverse=True)
        expected = runs.sort_values(f"metrics.{RANK_METRIC}", ascending=False, kind="stable")
        assert [r[header.index("run")].strip() for r in rows] == [i[:8] for i in expected["run_id"]] \
            or len(set(ranked)) < 2   # a tie may come in either order
        # The final phase reruns the best grid point by valid_bleu, without the proxy's cap.
        result = run("pipeline.experiments.sweep", "--phase", "final", "--dry-run")
        assert result.returncode == 0, result.stderr
        best = max(runs[f"metrics.{RANK_METRIC}"])
        best_values = [float(v) for v, s in zip(runs["params.train.lr_scale"], runs[f"metrics.{RANK_METRIC}"])
                       if s == best]
        queue = next(line for line in result.stdout.splitlines() if line.startswith("dvc exp run --queue"))
        chosen = float(queue.split("train.lr_scale=")[1].split()[0])
        assert chosen in best_values and (len(best_values) == 1 or chosen == 0.5)  # ties: the grid's order
        assert "max_minutes" not in queue
        # The winner (its DVC experiment is in this clone) applied and registered, its lineage on the card.
        assert set(runs["tags.sweep.experiment"]) == set(exps)
        result = run("pipeline.experiments.apply", "--sweep", name)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        assert "now commit it" in result.stdout and "$ dvc exp pull" not in result.stdout
        (version,) = mlflow.MlflowClient().search_model_versions(f"name = '{TINY['tracking']['registered_model']}'")
        assert version.tags["sweep"] == name and f"Chosen by the sweep `{name}`" in version.description
        assert mlflow.MlflowClient().get_run(version.run_id).data.metrics[RANK_METRIC] == best
    else:  # without the tune stage no run has valid_bleu: both rank last, by no test score
        assert all(math.isnan(v) for v in ranked)
