"""pipeline/config/recipe.py: a params file under params/ as one `dvc exp run -S ...`, checked first."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from pipeline.config.errors import ParamsError
from pipeline.config.overrides import with_overrides
from pipeline.config.recipe import check_recipe, exp_run_args, recipe_keys
from tests.pipeline.conftest import BIN, REPO

pytestmark = pytest.mark.fast

RECIPES = sorted((REPO / "params").glob("wmt14_*.yaml"))


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    (tmp_path / "params").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.name for r in RECIPES])
def test_the_set_params_make_params_yaml_the_recipe(recipe, workspace):
    """DVC's own parser of ``-S`` (the Hydra overrides ``dvc exp run`` applies) turns params.yaml into
    params.yaml with every recipe key set: lists stay lists, empty strings and nulls stay so, a key
    params.yaml lacks (model.dropout) is added."""
    from dvc.utils.hydra import apply_overrides

    keys = check_recipe(recipe)
    raw = yaml.safe_load((workspace / "params.yaml").read_text())
    args = exp_run_args(keys, raw)
    assert args[:2] == ["exp", "run"] and args[2::2] == ["-S"] * len(keys)
    apply_overrides(workspace / "params.yaml", args[3::2])
    applied = yaml.safe_load((workspace / "params.yaml").read_text())
    assert applied == with_overrides(raw, keys)
    recipe_raw = yaml.safe_load(recipe.read_text())
    for section, values in recipe_raw.items():   # the recipe's keys, as it has them: the run is the recipe's
        assert {k: applied[section][k] for k in values} == values


def test_a_partial_recipe_overrides_only_its_keys(workspace):
    recipe = workspace / "params/short.yaml"
    recipe.write_text("train:\n  max_steps: 400\n  lr_scale: 1\ntune:\n  alphas: [1.0, 1.5]\n")
    keys = check_recipe(recipe)
    assert keys == {"train.max_steps": 400, "train.lr_scale": 1, "tune.alphas": [1.0, 1.5]}
    assert exp_run_args(keys, yaml.safe_load((workspace / "params.yaml").read_text())) == [
        "exp", "run", "-S", "train.max_steps=400", "-S", "train.lr_scale=1", "-S", "tune.alphas=[1.0,1.5]"]


@pytest.mark.parametrize("text, message", [
    ("train:\n  max_tokens: -5\n", "^params/bad.yaml: train.max_tokens must be a positive integer, got -5$"),
    ("train:\n  warmup_stepz: 10\n", "^params/bad.yaml: unknown key train.warmup_stepz"),
    ("trian:\n  max_steps: 10\n", "^params/bad.yaml: unknown section trian"),
    ("train: 5\n", "^params/bad.yaml: section train must be a mapping, got 5$"),
    ("- 1\n", "must be a mapping of params.yaml sections"),
    ("train: [\n", "is not valid YAML"),
])
def test_a_bad_recipe_is_one_line_naming_the_file_and_key(workspace, text, message):
    (workspace / "params/bad.yaml").write_text(text)
    with pytest.raises(ParamsError, match=message):
        check_recipe(Path("params/bad.yaml"))   # as make run names it, from the repository root
    with pytest.raises(ParamsError, match="recipe params/nope.yaml does not exist"):
        recipe_keys(Path("params/nope.yaml"))


def test_the_command_checks_then_exits_2_on_a_bad_recipe(workspace):
    (workspace / "params/bad.yaml").write_text("evaluate:\n  beam_size: 0\n")
    result = subprocess.run([str(BIN / "python"), "-m", "pipeline.config.recipe", "params/bad.yaml"],
                            cwd=workspace, capture_output=True, text=True, env={"PYTHONPATH": str(REPO)})
    assert result.returncode == 2
    assert result.stderr.strip() == "error: params/bad.yaml: evaluate.beam_size must be a positive integer, got 0"
    (workspace / "params/ok.yaml").write_text("train:\n  max_steps: 400\n")
    result = subprocess.run([str(BIN / "python"), "-m", "pipeline.config.recipe", "params/ok.yaml", "--dry-run"],
                            cwd=workspace, capture_output=True, text=True, env={"PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "$ dvc exp run -S train.max_steps=400"


def test_a_stopped_training_is_not_handed_to_dvc_exp_run(workspace):
    """``dvc exp run`` checks out dvc.lock's outputs by force before it runs: checkpoints dvc.lock does
    not record (a training stopped by a signal, its resume point) would be deleted. The command
    refuses in one line, exit 2, the checkpoints untouched; recorded ones, or none, go through."""
    dvc = str(BIN / "dvc")
    for command in (["git", "init", "-q"], [dvc, "init", "-q"]):
        subprocess.run(command, cwd=workspace, check=True, capture_output=True)
    checkpoints = workspace / "models/checkpoints"
    (workspace / "dvc.yaml").write_text(
        "stages:\n  train:\n    cmd: mkdir -p models/checkpoints && echo 10 > models/checkpoints/step_00000010.pt\n"
        "    outs:\n      - models/checkpoints:\n          persist: true\n")
    subprocess.run([dvc, "repro", "-q"], cwd=workspace, check=True, capture_output=True)
    (workspace / "params/ok.yaml").write_text("train:\n  max_steps: 400\n")

    def recipe() -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "python"), "-m", "pipeline.config.recipe", "params/ok.yaml", "--dry-run"],
                              cwd=workspace, capture_output=True, text=True, env={"PYTHONPATH": str(REPO)})

    recorded = recipe()
    assert recorded.returncode == 0 and recorded.stdout.splitlines()[-1] == "$ dvc exp run -S train.max_steps=400"
    (checkpoints / "step_00000020.pt").write_text("20")   # the training went on, then stopped
    stopped = recipe()
    assert stopped.returncode == 2 and stopped.stdout.splitlines()[-1].startswith("params.yaml with params/ok.yaml")
    assert stopped.stderr.strip() == (
        "error: models/checkpoints holds a training dvc.lock does not record (newest: step_00000020.pt), which dvc "
        "exp run would delete (it checks out dvc.lock's outputs first). To continue it: dvc repro (params.yaml holds "
        "the values it ran with); to run params/ok.yaml afresh: remove models/checkpoints first")
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_00000010.pt", "step_00000020.pt"]
    shutil.rmtree(checkpoints)
    assert recipe().returncode == 0   # nothing to lose
