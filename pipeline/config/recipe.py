"""A recipe: a params file under ``params/`` (all of params.yaml, or some sections or keys of it) run
as one DVC experiment, each of its keys an override DVC records.

    make run RECIPE=params/wmt14_en_de_base.yaml
    python -m pipeline.config.recipe params/wmt14_en_de_base.yaml [--check | --dry-run]

params.yaml with the recipe applied is checked first (one line naming the key, exit 2; DVC deletes a
stage's outputs before the stage could refuse a value), then ``dvc exp run -S section.key=value ...``
runs the pipeline in the workspace: DVC writes the values into params.yaml and records them with the
experiment, so the recipe's run is reproducible and comparable (``dvc exp show``) like any other.

``dvc exp run`` first checks out the outputs ``dvc.lock`` records, by force: a training stopped before
its end (a signal, ``train.max_minutes``) would lose its resume point. So the command refuses while
``models/checkpoints`` holds checkpoints ``dvc.lock`` does not record (``dvc status``) and says how to
continue (``dvc repro``: params.yaml already holds the recipe's values) or start afresh.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from pipeline.config import paths
from pipeline.config.errors import ParamsError, exit_2_on
from pipeline.config.loader import PARAMS, SECTION_NAMES, read_params
from pipeline.config.overrides import dvc_executable, set_param
from pipeline.config.params import check


def recipe_keys(path: Path) -> dict[str, Any]:
    """``path``'s keys as ``{"section.key": value}``, in the file's order; ``ParamsError`` naming
    the file when it is missing, not YAML, or not sections of keys."""
    if not path.is_file():
        raise ParamsError(f"recipe {path} does not exist")
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ParamsError(f"recipe {path} is not valid YAML: {' '.join(str(err).split())}") from None
    if not isinstance(doc, dict):
        raise ParamsError(f"recipe {path} must be a mapping of params.yaml sections")
    keys: dict[str, Any] = {}
    for section, values in doc.items():
        if section not in SECTION_NAMES:
            raise ParamsError(f"{path}: unknown section {section} (known: {', '.join(SECTION_NAMES)})")
        if not isinstance(values, dict):
            raise ParamsError(f"{path}: section {section} must be a mapping, got {values!r}")
        keys.update({f"{section}.{name}": value for name, value in values.items()})
    return keys


def check_recipe(path: Path, params: Path = PARAMS) -> dict[str, Any]:
    """``params`` alone, then with ``path``'s keys applied, validated as ``make run`` validates
    params.yaml; an error names the file whose value is bad. Returns the recipe's keys."""
    read_params(params)
    check(params)
    keys = recipe_keys(path)
    try:
        check(params, keys)
    except ParamsError as err:
        raise ParamsError(f"{path}: {str(err).removeprefix('params.yaml: ')}") from None
    return keys


def exp_run_args(keys: dict[str, Any], raw: dict[str, Any]) -> list[str]:
    """``dvc exp run`` with one ``-S section.key=value`` per recipe key (``+section.key`` for a key
    params.yaml lacks, as Hydra requires; a list as ``[a,b]``, never a comma sweep)."""
    args = ["exp", "run"]
    for key, value in keys.items():
        args += ["-S", set_param(key, [value], raw)]
    return args


class UnfinishedTraining(RuntimeError):
    """A resume point in the workspace that ``dvc exp run`` would delete, or no answer from ``dvc status``."""


def unrecorded_checkpoints(dvc: str) -> list[Path]:
    """The checkpoints in ``models/checkpoints`` when ``dvc.lock`` records others or none (``dvc status``
    of the train stage says the directory changed, not that it is missing): a training's resume point
    that ``dvc exp run``'s forced checkout would delete. Empty where there is nothing to lose."""
    checkpoints = sorted(paths.CHECKPOINT_DIR.glob("*.pt")) if paths.CHECKPOINT_DIR.is_dir() else []
    if not checkpoints:
        return []
    result = subprocess.run([dvc, "status", "--json", "train"], capture_output=True, text=True)
    if result.returncode != 0:
        raise UnfinishedTraining(f"dvc status train failed: {' '.join(result.stderr.split())[-300:]}")
    status = json.loads(result.stdout or "{}")
    for entry in status.get("train", []):
        if isinstance(entry, dict) and str(paths.CHECKPOINT_DIR) in entry.get("changed outs", {}):
            return checkpoints
    return []


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe", type=Path, help="a params file, e.g. params/wmt14_en_de_base.yaml")
    parser.add_argument("--check", action="store_true", help="check params.yaml with the recipe, run nothing")
    parser.add_argument("--dry-run", action="store_true", help="print the dvc command, run nothing")
    args = parser.parse_args(argv)
    keys = check_recipe(args.recipe)
    print(f"{PARAMS} with {args.recipe}: every section valid", flush=True)
    if args.check:
        return
    command = [dvc_executable(), *exp_run_args(keys, read_params(PARAMS))]
    if unfinished := unrecorded_checkpoints(command[0]):
        raise UnfinishedTraining(
            f"{paths.CHECKPOINT_DIR} holds a training dvc.lock does not record (newest: {unfinished[-1].name}), "
            f"which dvc exp run would delete (it checks out dvc.lock's outputs first). To continue it: dvc repro "
            f"(params.yaml holds the values it ran with); to run {args.recipe} afresh: remove "
            f"{paths.CHECKPOINT_DIR} first")
    print("$ dvc " + shlex.join(command[1:]), flush=True)
    if not args.dry_run:
        sys.exit(subprocess.run(command).returncode)


if __name__ == "__main__":
    exit_2_on((ParamsError, UnfinishedTraining), main)
