"""A hyper-parameter sweep as DVC experiments: the grid of ``params/sweep.yaml`` queued with DVC's own
grid syntax and run one experiment at a time by DVC's queue, in two phases.

    python -m pipeline.experiments.sweep --phase proxy            # every grid point, short (the proxy overrides)
    python -m pipeline.experiments.sweep --phase final [--top K]  # the K best proxy points by valid_bleu, full runs
    python -m pipeline.experiments.sweep --phase final --dry-run  # print the dvc commands, run nothing

proxy: ``dvc exp run --queue -n proxy-<time> -S key=a,b,c ... -S <proxy override>`` (one queued
experiment per grid point), then ``dvc exp run --run-all -j 1``. final: the grid points whose proxy
runs have the best ``valid_bleu`` in MLflow (validation BLEU of the averaged model, decoding chosen on
val; test scores never choose) are queued again, one ``dvc exp run --queue -n final-<time>-<i> -S ...``
each, with the final overrides instead of the proxy ones (so ``train.max_minutes`` is params.yaml's
again), and run the same way. Every experiment is a full ``dvc.yaml`` pipeline in a DVC temporary
workspace; each logs its MLflow run into this repository's store (``MLFLOW_TRACKING_URI`` is set to it
for the queue unless already set), tagged ``sweep=<proxy|final>-<time>`` (the name the command prints),
its model logged, not registered. Results: ``make compare SWEEP=<name>``, ``dvc exp show``, ``make ui``.
On the team's work pool instead, one point per worker: ``make sweep POOL=...`` (``pipeline.workers.sweep``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pipeline.config.errors import ParamsError
from pipeline.config.loader import PARAMS, SECTION_NAMES, read_params
from pipeline.config.overrides import dvc_executable, hydra_value, set_param
from pipeline.config.params import check, load_params
from pipeline.scoring.reports import RANK_METRIC
from pipeline.tracking.sweep_point import SWEEP_VAR

SWEEP_FILE = Path("params/sweep.yaml")
PHASES = ("proxy", "final")


class SweepError(ValueError):
    """params/sweep.yaml is malformed or names a bad key or value; the message names it."""


@dataclass(frozen=True)
class Sweep:
    grid: dict[str, list[Any]]    # params.yaml key -> values; every combination is a grid point
    proxy: dict[str, Any]         # fixed overrides of the proxy phase (short runs)
    final: dict[str, Any]         # fixed overrides of the final phase
    top: int                      # finalists the final phase reruns

    def points(self) -> list[dict[str, Any]]:
        """Every combination of the grid's values, in the file's order."""
        keys = list(self.grid)
        return [dict(zip(keys, values)) for values in itertools.product(*self.grid.values())]


def _validate(where: Path, params_path: Path, overrides: dict[str, Any]) -> None:
    """params.yaml with ``overrides`` applied, checked as ``make run`` checks it; its one-line error
    becomes this file's."""
    try:
        check(params_path, overrides)
    except ParamsError as err:
        raise SweepError(f"{where}: {str(err).removeprefix('params.yaml: ')}") from None


def _check_key(where: Path, group: str, key: Any) -> str:
    if not isinstance(key, str) or key.count(".") != 1 or not all(key.split(".")):
        raise SweepError(f"{where}: {group} key {key!r} is not a params.yaml key of the form section.key")
    section = key.split(".")[0]
    if section not in SECTION_NAMES:
        raise SweepError(f"{where}: unknown key {key}: params.yaml has no section {section} "
                         f"(sections: {', '.join(SECTION_NAMES)})")
    return key


def load_sweep(path: Path = SWEEP_FILE, params_path: Path = PARAMS) -> Sweep:
    """Read and validate ``path``: every key must be a params.yaml key and every grid point (with the
    proxy overrides, and with the final ones) must pass params.yaml's validation."""
    if not path.is_file():
        raise SweepError(f"sweep file {path} does not exist")
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise SweepError(f"{path} is not valid YAML: {' '.join(str(err).split())}") from None
    if not isinstance(doc, dict):
        raise SweepError(f"{path} must be a mapping with grid, proxy, final and top")
    unknown = sorted(set(doc) - {"grid", "proxy", "final", "top"})
    if unknown:
        raise SweepError(f"{path}: unknown entry {unknown[0]} (known: grid, proxy, final, top)")
    grid_doc, top = doc.get("grid") or {}, doc.get("top", 2)
    if not isinstance(grid_doc, dict) or not grid_doc:
        raise SweepError(f"{path}: grid must map params.yaml keys to lists of values")
    grid: dict[str, list[Any]] = {}
    for key, values in grid_doc.items():
        _check_key(path, "grid", key)
        if not isinstance(values, list) or not values:
            raise SweepError(f"{path}: grid {key} must be a non-empty list of values, got {values!r}")
        if len({json.dumps(v, sort_keys=True) for v in values}) != len(values):
            raise SweepError(f"{path}: grid {key} lists a value twice: {values}")
        grid[key] = values
    fixed: dict[str, dict[str, Any]] = {}
    for group in ("proxy", "final"):
        values = doc.get(group) or {}
        if not isinstance(values, dict):
            raise SweepError(f"{path}: {group} must map params.yaml keys to one value each, got {values!r}")
        for key in values:
            _check_key(path, group, key)
            if key in grid:
                raise SweepError(f"{path}: {key} is both in grid and in {group}")
        fixed[group] = dict(values)
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise SweepError(f"{path}: top must be a positive integer, got {top!r}")
    sweep = Sweep(grid, fixed["proxy"], fixed["final"], top)
    read_params(params_path)   # params.yaml's own problems (missing, not YAML) named as its own
    for key, values in grid.items():                      # each key alone first: the error names it
        for value in values:
            _validate(path, params_path, {key: value})
    for group in (sweep.proxy, sweep.final):   # together: a phase's keys may hold each other up
        _validate(path, params_path, group)   # (train.max_steps 0 beside train.max_minutes)
    for point in sweep.points():
        for group in (sweep.proxy, sweep.final):
            _validate(path, params_path, {**point, **group})
    return sweep


# ----------------------------------------------------------------------------- dvc commands


def queue_args(name: str, grid: dict[str, list[Any]], fixed: dict[str, Any], raw: dict[str, Any]) -> list[str]:
    args = ["exp", "run", "--queue", "-n", name]
    for key, values in grid.items():
        args += ["-S", set_param(key, values, raw)]
    for key, value in fixed.items():
        args += ["-S", set_param(key, [value], raw)]
    return args


RUN_ARGS = ["exp", "run", "--run-all", "-j", "1"]   # one worker: experiments run one after the other


def dvc(args: list[str], capture: bool = False) -> subprocess.CompletedProcess:
    print("$ dvc " + " ".join(_shell_quote(a) for a in args), flush=True)
    result = subprocess.run([dvc_executable(), *args], text=True, capture_output=capture)
    if result.returncode != 0:
        detail = (result.stderr or "").strip().splitlines()[-1:] if capture else []
        raise SweepError(f"dvc {' '.join(args[:3])} failed (exit {result.returncode})"
                         + (f": {detail[0]}" if detail else ""))
    return result


def _shell_quote(arg: str) -> str:
    return arg if re.match(r"^[\w\-.,=+/:\[\]]+$", arg) else "'" + arg.replace("'", "'\\''") + "'"


def experiment_states(prefix: str) -> dict[str, str]:
    """``{experiment name: executor state}`` of the DVC experiments named ``prefix`` or ``prefix-N``."""
    shown = json.loads(dvc(["exp", "show", "--json"], capture=True).stdout or "[]")
    states = {}
    for baseline in shown:
        for exp in baseline.get("experiments") or []:
            name = exp.get("name") or ""
            if name == prefix or name.startswith(prefix + "-"):
                states[name] = (exp.get("executor") or {}).get("state") or "success"
    return states


# ----------------------------------------------------------------------------- MLflow


def _same(logged: str | None, value: Any) -> bool:
    """Whether an MLflow param string (``pipeline.tracking.tags.param_value``) holds ``value``."""
    if logged is None or (isinstance(logged, float) and math.isnan(logged)):
        return False
    if isinstance(value, bool):
        return logged.lower() == str(value).lower()
    if isinstance(value, (int, float)):
        try:
            return float(logged) == float(value)
        except ValueError:
            return False
    if isinstance(value, (list, dict)):
        try:
            return json.loads(logged) == value
        except ValueError:
            return False
    return logged == str(value)


def runs_frame(experiment: str):
    """Every run of ``experiment`` (a pandas DataFrame of ``mlflow.search_runs``)."""
    import mlflow

    from pipeline.tracking import store

    store.client()
    return mlflow.search_runs(experiment_names=[experiment], max_results=10_000)


def point_scores(runs, points: list[dict[str, Any]], fixed: dict[str, Any]) -> list[dict[str, Any]]:
    """For each grid point, the best ``valid_bleu`` among the runs holding its values and ``fixed``
    (NaN when none has one), with the first test BLEU of that run; best first, unscored last."""
    metric = f"metrics.{RANK_METRIC}"
    test_cols = sorted(c for c in runs.columns if c.startswith("metrics.test/") and c.endswith("/bleu"))
    rows = []
    for index, point in enumerate(points):
        wanted = {**point, **fixed}
        best, test, run_id = math.nan, math.nan, ""
        for _, run in runs.iterrows():
            if not all(_same(run.get(f"params.{k}"), v) for k, v in wanted.items()):
                continue
            score = run.get(metric, math.nan)
            if score is not None and not math.isnan(score) and (math.isnan(best) or score > best):
                best, run_id = float(score), run["run_id"]
                test = float(run[test_cols[0]]) if test_cols and not math.isnan(run[test_cols[0]]) else math.nan
        rows.append({"point": point, RANK_METRIC: best, "test_bleu": test, "run": run_id, "order": index})
    return sorted(rows, key=lambda r: (math.isnan(r[RANK_METRIC]), -(r[RANK_METRIC] if not math.isnan(r[RANK_METRIC])
                                                                       else 0.0), r["order"]))


def print_scores(rows: list[dict[str, Any]], title: str) -> None:
    print(f"\n{title} (ranked by {RANK_METRIC}, validation; test BLEU shown, never used to rank)")
    for rank, row in enumerate(rows, 1):
        values = " ".join(f"{k}={hydra_value(v)}" for k, v in row["point"].items())
        score = "   -  " if math.isnan(row[RANK_METRIC]) else f"{row[RANK_METRIC]:6.2f}"
        test = "   -  " if math.isnan(row["test_bleu"]) else f"{row['test_bleu']:6.2f}"
        print(f"{rank:3d}. {RANK_METRIC} {score}  test BLEU {test}  {values}  {row['run'][:8]}")


# ----------------------------------------------------------------------------- phases


def _use_repository_store(experiment: str) -> None:
    """Queued experiments run in temporary copies of the repository: point their MLflow at this
    repository's store (the embedded SQLite one unless MLFLOW_TRACKING_URI is set), and create the
    experiment here first, so that its artifacts live beside the store, not in a deleted copy."""
    from pipeline.tracking import store
    from pipeline.tracking.failures import best_effort

    os.environ["MLFLOW_TRACKING_URI"] = store.tracking_uri()
    best_effort("experiment creation", store.experiment_id, experiment)


def final_values(sweep: Sweep, raw: dict[str, Any]) -> dict[str, Any]:
    """The fixed values a final run holds: the final overrides, and params.yaml's own value of each
    proxy key (what tells a final run from the proxy run of the same grid point)."""
    values = {}
    for key in sweep.proxy:
        section, name = key.split(".", 1)
        if isinstance(raw.get(section), dict) and name in raw[section]:
            values[key] = raw[section][name]
    return {**values, **sweep.final}


def run_phase(phase: str, sweep: Sweep, top: int | None = None, dry_run: bool = False) -> int:
    params = load_params(PARAMS)
    raw = params.raw
    stamp = time.strftime("%m%d-%H%M%S")
    name = f"{phase}-{stamp}"
    if phase == "proxy":
        points = sweep.points()
        commands = [queue_args(name, sweep.grid, sweep.proxy, raw)]
    else:
        k = top or sweep.top
        scored = [r for r in point_scores(runs_frame(params.tracking.experiment), sweep.points(), sweep.proxy)
                  if not math.isnan(r[RANK_METRIC])]
        if not scored:
            raise SweepError(f"no proxy run of this grid has {RANK_METRIC} in MLflow experiment "
                             f"{params.tracking.experiment!r}: run `make sweep` first")
        print_scores(scored, f"proxy runs of {len(sweep.points())} grid points")
        finalists = scored[:k]
        if len(finalists) < k:
            print(f"only {len(finalists)} grid point(s) have a proxy {RANK_METRIC}; running those", flush=True)
        points = [r["point"] for r in finalists]
        commands = [queue_args(f"{name}-{i}", {key: [v] for key, v in point.items()}, sweep.final, raw)
                    for i, point in enumerate(points, 1)]
    print(f"{phase}: {len(points)} experiment(s), one at a time", flush=True)
    if dry_run:
        for args in commands + [RUN_ARGS]:
            print("dvc " + " ".join(_shell_quote(a) for a in args))
        return 0
    _use_repository_store(params.tracking.experiment)
    os.environ[SWEEP_VAR] = name   # the queue's experiments: runs tagged sweep=<name>, models not registered
    for args in commands:
        dvc(args)
    dvc(RUN_ARGS)
    states = experiment_states(name)
    failed = sorted(n for n, state in states.items() if state != "success")
    print(f"\nDVC experiments {name}*: " + ", ".join(f"{n} {s}" for n, s in sorted(states.items())))
    fixed = sweep.proxy if phase == "proxy" else final_values(sweep, raw)
    print_scores(point_scores(runs_frame(params.tracking.experiment), points, fixed), f"{phase} phase")
    print(f"\nresults: `make compare SWEEP={name}` (this sweep's runs, reports/compare.md), `dvc exp show` (the "
          "experiments), `make ui` (MLflow)")
    if phase == "proxy":
        print(f"next: python -m pipeline.experiments.sweep --phase final --top {sweep.top}")
    if failed or len(states) != len(points):
        print(f"error: {len(failed) + len(points) - len(states)} of {len(points)} experiment(s) did not succeed: "
              f"{', '.join(failed) or '(missing)'}; logs: dvc queue logs <name>", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--phase", choices=PHASES, default="proxy")
    parser.add_argument("--top", type=int, help="finalists of the final phase (default: top in the sweep file)")
    parser.add_argument("--file", type=Path, default=SWEEP_FILE, help=f"the sweep (default {SWEEP_FILE})")
    parser.add_argument("--dry-run", action="store_true", help="print the dvc commands, run nothing")
    args = parser.parse_args(argv)
    try:
        if args.top is not None and args.top < 1:
            raise SweepError(f"--top must be positive, got {args.top}")
        sweep = load_sweep(args.file, PARAMS)
        sys.exit(run_phase(args.phase, sweep, args.top, args.dry_run))
    except (SweepError, ParamsError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
