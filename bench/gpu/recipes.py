"""Train Multi30k recipes through the pipeline's own stages, without DVC or MLflow, and choose on val.

Each recipe of ``bench/gpu/recipes.yaml`` runs in a workspace of its own (``<work>/<name>/``: its
params.yaml, ``data`` linked to the carried data, ``models/`` and ``reports/`` its own) as ``dvc
repro`` would run it after the tokenizer: ``python -m pipeline.stages.train``, then ``average``,
``tune`` and ``evaluate``, with ``PIPELINE_TRACKING=off``.

- ``--set default``: params.yaml as it is, every stage; the figures are the training's wall time
  and steps, the validation BLEU (tune's choice) and the test BLEU.
- ``--set candidates``: each candidate is trained, averaged and tuned; the one with the highest
  validation BLEU (ties: the earlier in the file) is chosen, and only it decodes the test set
  (held-out means held out). Its overrides of params.yaml are written as ``<work>/multi30k_gpu.yaml``,
  ending on the updates it reached, for ``params/``. A candidate that would not fit in what is left of
  ``--budget-seconds`` (its ``train.max_minutes`` plus the stages around it) is skipped and said so.
  With ``--parallel`` the candidates train, average and tune at the same time, each in its own
  processes on the one GPU (small models leave it mostly idle: their steps are bound by kernel
  launches), so their wall times are upper bounds of what each takes alone.

``<work>/results.json`` is rewritten after every stage, so that a campaign step cut by its time
limit still reports what finished.

    python -m bench.gpu.recipes --data .gpu/multi30k/data --work DIR --set default|candidates
                                [--recipes bench/gpu/recipes.yaml] [--rehearse] [--budget-seconds N] [--parallel]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from pipeline.config.params import ParamsError, load_params
from transformer.atomic import write_json, write_text

REPO = Path(__file__).resolve().parents[2]
RECIPES = Path(__file__).with_name("recipes.yaml")
FROZEN_SECTIONS = ("data", "tokenizer")   # the carried data are the default run's
# Seconds on a GPU (estimates, with margin) around a candidate's training: the stages' start-ups, average
# and tune; and, kept for the end, the chosen one's evaluate.
AROUND_TRAINING_S, EVALUATE_RESERVE_S = 45.0, 30.0


def merged(base: dict[str, Any], overrides: dict[str, Any], replace: tuple[str, ...] = ()) -> dict[str, Any]:
    """``base`` with each section of ``overrides`` merged key by key (sections in ``replace``: whole)."""
    out = {name: dict(section) if isinstance(section, dict) else section for name, section in base.items()}
    for name, section in overrides.items():
        if name in FROZEN_SECTIONS:
            raise SystemExit(f"error: a recipe may not change {name!r}: the campaign carries one data set")
        out[name] = dict(section) if name in replace else {**out.get(name, {}), **section}
    return out


def recipe_params(overrides: dict[str, Any], rehearse: dict[str, Any] | None) -> dict[str, Any]:
    params = merged(yaml.safe_load((REPO / "params.yaml").read_text()), overrides)
    if rehearse:
        params = merged(params, rehearse, replace=("model",))
    return params


class Workspace:
    """One recipe's folder, run as DVC would run its stages after the tokenizer."""

    def __init__(self, root: Path, name: str, params: dict[str, Any], data: Path,
                 overrides: dict[str, Any] | None = None) -> None:
        self.path, self.name, self.params = root / name, name, params
        self.overrides = overrides or {}
        self.path.mkdir(parents=True, exist_ok=True)
        write_text(self.path / "params.yaml", yaml.safe_dump(params, sort_keys=False))
        link = self.path / "data"
        if not link.exists():
            link.symlink_to(data.resolve(), target_is_directory=True)
        try:   # the stages would refuse a bad value too, but only after the first has run
            load_params(self.path / "params.yaml")
        except ParamsError as err:
            raise SystemExit(f"error: recipe {name}: {err}") from None
        self.seconds: dict[str, float] = {}

    def run(self, stage: str) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               "PIPELINE_TRACKING": "off"}
        print(f"[{self.name}] {stage}", flush=True)
        start = time.monotonic()
        with open(self.path / f"{stage}.log", "w") as log:
            result = subprocess.run([sys.executable, "-m", f"pipeline.stages.{stage}"], cwd=self.path, env=env,
                                    stdout=log, stderr=subprocess.STDOUT)
        self.seconds[stage] = round(time.monotonic() - start, 1)
        tail = (self.path / f"{stage}.log").read_text().splitlines()[-12:]
        print("\n".join(f"  {line}" for line in tail), flush=True)
        if result.returncode != 0:
            raise RuntimeError(f"recipe {self.name}: the {stage} stage failed (exit {result.returncode}); "
                               f"see {self.path / (stage + '.log')}")

    def report(self, name: str) -> dict[str, Any]:
        file = self.path / "reports" / name
        return json.loads(file.read_text()) if file.is_file() else {}

    def train_seconds(self) -> float | None:
        """The training loop's wall time, as the train stage printed it (process start-up excluded)."""
        log = self.path / "train.log"
        found = re.findall(r"^trained \d+ steps in ([\d.]+) s", log.read_text(), re.MULTILINE) if log.is_file() else []
        return float(found[-1]) if found else None

    def summary(self) -> dict[str, Any]:
        train, tune, metrics = self.report("train_metrics.json"), self.report("tune.json"), self.report("metrics.json")
        test_sets, tests = self.params["data"]["test_sets"], metrics.get("test", {})
        return {"seconds": self.seconds, "train_seconds": self.train_seconds(), "steps": train.get("steps"),
                "epochs": train.get("epochs"),
                "parameters": train.get("parameters"),
                "valid_bleu": tune.get("valid_bleu"),
                "beam_size": tune.get("chosen", {}).get("beam_size"), "alpha": tune.get("chosen", {}).get("alpha"),
                "stopping": tune.get("chosen", {}).get("stopping", "exact"),
                "test": {t: {k: tests[t][k] for k in ("bleu", "bleu_ci95", "bleu_lc_tok", "chrf") if k in tests[t]}
                         for t in test_sets if t in tests},
                "model": self.params["model"], "train": self.params["train"]}


def recipe_file(ws: Workspace) -> str:
    """The chosen recipe as a params file for ``params/``: its overrides of params.yaml (each one a ``dvc exp
    run -S`` of ``make run RECIPE=``), ending on the updates its run reached instead of on the clock."""
    overrides = {name: dict(section) for name, section in ws.overrides.items()}
    train = overrides.setdefault("train", {})
    train.pop("max_minutes", None)
    train["max_steps"] = int(ws.summary()["steps"])
    return ("# Multi30k on one GPU, chosen on val by the GPU campaign (bench/gpu/recipes.py, recipe "
            f"{ws.name}).\n# Use: make run RECIPE=params/multi30k_gpu.yaml\n"
            + yaml.safe_dump(overrides, sort_keys=False, default_flow_style=None))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="the carried data folder (bench.gpu.prepare)")
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--set", choices=["default", "candidates"], required=True)
    parser.add_argument("--recipes", type=Path, default=RECIPES)
    parser.add_argument("--rehearse", action="store_true", help="the recipes file's rehearse overrides (CPU)")
    parser.add_argument("--budget-seconds", type=float, default=0, help="skip candidates that would not fit (0 = none)")
    parser.add_argument("--parallel", action="store_true", help="the candidates at the same time (one GPU, shared)")
    args = parser.parse_args()
    started = time.monotonic()
    spec = yaml.safe_load(args.recipes.read_text())
    rehearse = spec.get("rehearse") if args.rehearse else None
    recipes = {"default": spec.get("default") or {}} if args.set == "default" else spec["candidates"]
    args.work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"set": args.set, "rehearse": args.rehearse, "recipes": {}, "skipped": []}
    out = args.work / "results.json"
    spaces: list[Workspace] = []
    lock = threading.Lock()
    stages = ["train", "average", "tune"] + (["evaluate"] if args.set == "default" else [])

    def fits(name: str, params: dict[str, Any]) -> bool:
        """Whether the candidate's training cap and the stages around it fit in what is left of the budget."""
        cap = 60 * float(params["train"].get("max_minutes") or 0)
        left = args.budget_seconds - (time.monotonic() - started)
        need = cap + AROUND_TRAINING_S + EVALUATE_RESERVE_S
        if args.budget_seconds and cap and need > left:
            print(f"[{name}] skipped: {cap:.0f} s of training and ~{need - cap:.0f} s around it do not fit in the "
                  f"{left:.0f} s left", flush=True)
            results["skipped"].append(name)
            return False
        return True

    def run_all(ws: Workspace) -> None:
        for stage in stages:
            ws.run(stage)
            with lock:
                results["recipes"][ws.name] = ws.summary()
                write_json(out, results)

    if args.parallel:   # every candidate starts now: each must fit in the whole budget
        for name, overrides in recipes.items():
            params = recipe_params(overrides or {}, rehearse)
            if fits(name, params):
                spaces.append(Workspace(args.work, name, params, args.data, overrides))
        results["parallel"] = [ws.name for ws in spaces]
        write_json(out, results)
        with ThreadPoolExecutor(max_workers=max(1, len(spaces))) as pool:
            errors = [f.exception() for f in [pool.submit(run_all, ws) for ws in spaces]]
        for err in errors:
            if err is not None:
                print(f"error: {err}", flush=True)
        spaces = [ws for ws, err in zip(spaces, errors) if err is None]   # a failed candidate is not chosen
    else:
        for name, overrides in recipes.items():
            params = recipe_params(overrides or {}, rehearse)
            if fits(name, params):
                spaces.append(Workspace(args.work, name, params, args.data, overrides))
                run_all(spaces[-1])
    if args.set == "candidates" and spaces:
        chosen = max(spaces, key=lambda w: w.summary()["valid_bleu"] or -1.0)   # max keeps the first of ties
        results["chosen"] = chosen.name
        results["rule"] = "highest validation BLEU (the tune stage's choice of beam and alpha on val); ties: the first"
        write_json(out, results)
        chosen.run("evaluate")
        results["recipes"][chosen.name] = chosen.summary()
        write_json(out, results)
        write_text(args.work / "multi30k_gpu.yaml", recipe_file(chosen))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
