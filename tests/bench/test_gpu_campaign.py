"""The GPU campaign's parts that can run here (bench/gpu_campaign.sh, bench/gpu/): the throughput bench on
a token store without the reference, the summary read from a step's real output, the recipes' overrides
and the recipe file they write, the rule that a skipped GPU test fails on the GPU machine, and the
script's refusals. Its whole rehearsal (``bench/gpu_campaign.sh rehearse``) takes minutes: docs/gpu.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bench.gpu import prepare, recipes
from pipeline.config.params import load_params
from tests.bench import ROOT, run_bench
from transformer.training.token_store import write_token_store

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def big_run(tmp_path_factory) -> subprocess.CompletedProcess:
    """The big step as the rehearsal runs it: a token store, no reference, a shape cut to seconds."""
    tmp = tmp_path_factory.mktemp("big")
    pairs = [([5 + i % 50] * (3 + i % 20), [6 + i % 40] * (4 + i % 25)) for i in range(600)]
    write_token_store(tmp / "store", pairs, vocab_size=120)
    return run_bench("train_throughput.py", ["--preset", "big", "--token-store", str(tmp / "store"), "--no-reference",
                                             "--precision", "fp32", "--d-model", "32", "--heads", "2", "--d-ff", "64",
                                             "--layers", "1", "--max-tokens", "400", "--rounds", "1", "--steps", "2",
                                             "--warmup", "0"], tmp)


def test_the_throughput_bench_cuts_its_batches_from_a_token_store_and_can_skip_the_reference(big_run):
    out = big_run.stdout
    assert "from the token store" in out and "(600 pairs, vocabulary 120), cycled" in out
    assert "reference" not in out.replace("no reference", "")
    lines = out.strip().splitlines()
    assert lines[-1].startswith("mfu=") and not any(line.startswith("ratio=") for line in lines)
    assert "preset big on cpu" in out


def write_step(work: Path, name: str, rc: int, seconds: int, cap: int, log: str, command: str = "cmd") -> None:
    (work / name).mkdir(parents=True, exist_ok=True)
    (work / name / "log.txt").write_text(log)
    (work / name / "command.txt").write_text(command)
    with open(work / "steps.txt", "a") as f:
        f.write(f"{name} rc={rc} seconds={seconds} cap={cap}\n")


def run_summary(work: Path) -> str:
    result = subprocess.run([sys.executable, "-m", "bench.gpu.summary", str(work)], cwd=ROOT, capture_output=True,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_summary_reads_the_benchs_own_output_and_names_a_step_cut_by_its_cap(big_run, tmp_path):
    work = tmp_path / "part1"
    (work).mkdir()
    (work / "environment.txt").write_text("gpu: none\n")
    write_step(work, "gpu_tests", 1, 40, 170, "....F\n== 1 failed, 21 passed in 30.1s ==\n")
    write_step(work, "big", 0, 12, 80, big_run.stdout, "python bench/train_throughput.py --preset big")
    write_step(work, "throughput_base_compiled", 124, 190, 190, "torch.compile warm-up (ours): 150.0 s\n")
    text = run_summary(work)
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert "1 failed, 21 passed" in rows["tests/gpu (a skip counts as a failure)"]
    ours = float(next(line for line in big_run.stdout.splitlines() if line.startswith("transformer package"))
                 .split(": ")[1].split(" target")[0].replace(",", ""))
    assert f"| {ours:,.0f} | >= 350,000 (missed) |" in rows["big preset: target tokens/s, ours"]
    hours = 300_000 * 25_000 / ours / 3600
    estimate = next(v for k, v in rows.items() if k.startswith("big preset: the paper's 300k updates"))
    assert f"{hours:,.0f} h on one GPU, {hours / 8:,.1f} h on 8" in estimate
    assert "cut at its 190 s cap" in rows["base, bf16, torch.compile: target tokens/s"]
    assert "- `big`: ok, 12 s of 80: `python bench/train_throughput.py --preset big`" in text


def test_recipes_may_not_change_the_carried_data_and_a_rehearsal_replaces_the_model_whole():
    with pytest.raises(SystemExit, match="may not change 'tokenizer'"):
        recipes.recipe_params({"tokenizer": {"vocab_size": 100}}, None)
    spec = yaml.safe_load(recipes.RECIPES.read_text())
    for name, overrides in spec["candidates"].items():
        params = recipes.recipe_params(overrides, spec["rehearse"])
        assert params["model"] == {"preset": "tiny"}, name
        assert params["train"]["max_steps"] == 20 and params["train"]["max_minutes"] == 0
        assert params["train"]["lr_scale"] == overrides["train"]["lr_scale"]   # the rest of the recipe stays
        assert params["data"] == yaml.safe_load((ROOT / "params.yaml").read_text())["data"]


def test_the_chosen_recipe_file_ends_on_the_updates_its_run_reached(tmp_path):
    spec = yaml.safe_load(recipes.RECIPES.read_text())
    name, overrides = next(iter(spec["candidates"].items()))
    ws = recipes.Workspace(tmp_path, name, recipes.recipe_params(overrides, None), tmp_path, overrides)
    (ws.path / "reports").mkdir()
    (ws.path / "reports" / "train_metrics.json").write_text(json.dumps({"steps": 4321, "epochs": 37}))
    recipe = yaml.safe_load(recipes.recipe_file(ws))
    # Only the recipe's overrides of params.yaml (make run RECIPE= sets each with dvc exp run -S), on updates
    assert set(recipe) == set(overrides) and "max_minutes" not in recipe["train"]
    assert recipe["train"] == {**{k: v for k, v in overrides["train"].items() if k != "max_minutes"},
                               "max_steps": 4321}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(recipes.recipe_params(recipe, None)))
    params = load_params(tmp_path / "params.yaml")
    assert params.train.max_steps == 4321 and params.train.max_minutes == 0
    assert params.model.config(8000).d_model == overrides["model"]["d_model"]


def test_a_skipped_gpu_test_fails_where_the_campaign_requires_the_gpu(tmp_path):
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/gpu/test_search_cuda.py"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    here = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    required = subprocess.run(args, cwd=ROOT, env={**env, "GPU_TESTS_REQUIRED": "1"}, capture_output=True,
                              text=True, timeout=120)
    if here.returncode == 0 and "passed" in here.stdout and "skipped" not in here.stdout:
        pytest.skip("a GPU is here: nothing is skipped")
    assert here.returncode == 0 and "skipped" in here.stdout
    assert required.returncode == 1 and "skipped where GPU_TESTS_REQUIRED=1 (a GPU machine)" in required.stdout


def test_prepare_reads_a_relative_data_mirror_from_where_it_was_called(tmp_path, monkeypatch):
    # Its stages run in a scratch folder: the README's DATA_MIRROR=../shared/data/multi30k failed there.
    (tmp_path / "repo").mkdir()
    monkeypatch.chdir(tmp_path / "repo")
    monkeypatch.setenv("DATA_MIRROR", "../shared/data/multi30k")
    assert prepare.data_mirror() == tmp_path / "shared" / "data" / "multi30k"
    monkeypatch.delenv("DATA_MIRROR")
    assert prepare.data_mirror() == prepare.DEFAULT_MIRROR.resolve()


def test_the_campaign_script_refuses_bad_arguments_and_a_missing_carried_folder(tmp_path):
    script = str(ROOT / "bench" / "gpu_campaign.sh")
    bad = subprocess.run([script, "3"], capture_output=True, text=True)
    assert bad.returncode == 2 and "usage: bench/gpu_campaign.sh prepare|1|2|all|profile|rehearse" in bad.stderr
    if not (ROOT / ".gpu" / "multi30k").is_dir():
        missing = subprocess.run([script, "1", "--out", str(tmp_path)], capture_output=True, text=True)
        assert missing.returncode == 2 and "run bench/gpu_campaign.sh prepare here first" in missing.stderr


def test_the_step_profile_times_steps_parts_and_operators_on_a_token_store(tmp_path):
    """bench/gpu/profile_step.py, the next GPU session's first step, at a shape cut to seconds on the CPU."""
    pairs = [([5 + i % 50] * (3 + i % 20), [6 + i % 40] * (4 + i % 25)) for i in range(600)]
    write_token_store(tmp_path / "store", pairs, vocab_size=120)
    result = subprocess.run([sys.executable, "-m", "bench.gpu.profile_step", "--token-store", str(tmp_path / "store"),
                             "--device", "cpu", "--d-model", "32", "--heads", "2", "--d-ff", "64", "--layers", "1",
                             "--max-tokens", "300", "--steps", "2"], cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for label in ("1. changing shapes: ms a step [", "2. one batch repeated: ms a step [",
                  "3. one step in parts (ms, median of 4): forward ", "4. profiler, 3 steps, by self_cpu_time_total"):
        assert label in out, label
    parts = out.split("3. one step in parts (ms, median of 4): ")[1].splitlines()[0]
    assert [p.split()[0] for p in parts.split(", ")] == ["forward", "loss", "backward", "optimizer"]
    assert "aten::" in out.split("4. profiler")[1]


def test_the_summary_reads_the_step_profiles_timed_lines(tmp_path):
    log = ("base on cuda (NVIDIA H100), torch 2.11.0, 271 batches, 25000 tokens a batch\n"
           "1. changing shapes: ms a step [350, 362], median 356.0; 63,000 target tokens/s\n"
           "2. one batch repeated: ms a step [40, 41], median 40.5; 550,000 target tokens/s\n"
           "3. one step in parts (ms, median of 4): forward 12.0, loss 300.1, backward 30.2, optimizer 2.0\n")
    write_step(tmp_path, "profile_base", 0, 40, 120, log)
    write_step(tmp_path, "profile_big", 124, 121, 120, "big on cuda\n")
    (tmp_path / "environment.txt").write_text("gpu: test\n")
    rows = {line.split(" | ")[0].lstrip("| "): line for line in run_summary(tmp_path).splitlines()
            if line.startswith("| profile")}
    assert "median 356.0; 63,000 target tokens/s" in rows["profile_base: 1. changing shapes"]
    assert "median 40.5" in rows["profile_base: 2. one batch repeated"]
    assert "loss 300.1" in rows["profile_base: 3. one step in parts (ms, median of 4)"]
    assert "cut at its 120 s cap" in rows["profile_big: a step's time"]
