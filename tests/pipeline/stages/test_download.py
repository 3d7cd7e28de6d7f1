"""pipeline/stages/download.py run as DVC runs it: ``python -m pipeline.stages.download`` in a folder
holding params.yaml; writes data/corpus, exits 2 with one ``error:`` line on bad params or data."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.stages.download import format_table

from ..conftest import make_workspace, tiny_params

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[3]
MIRROR = REPO.parent / "shared" / "data" / "multi30k"


def run_stage(cwd: Path, data: dict, mirror: Path | None) -> subprocess.CompletedProcess:
    """Write cwd/params.yaml (the repository's, with ``data`` overriding its data section) and run the stage."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["data"] = {**params.get("data", {}), **data}
    (cwd / "params.yaml").write_text(yaml.safe_dump(params))
    env = {k: v for k, v in os.environ.items() if k != "DATA_MIRROR"}
    env["PYTHONPATH"] = str(REPO)
    if mirror is not None:
        env["DATA_MIRROR"] = str(mirror)
    return subprocess.run([sys.executable, "-m", "pipeline.stages.download"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.pipeline
@pytest.mark.skipif(not (MIRROR / "data/task1/raw/train.en.gz").is_file(),
                    reason=f"the Multi30k mirror is not at {MIRROR} (see shared/data/README.md)")
def test_stage_writes_the_corpus(tmp_path):
    result = run_stage(tmp_path, {"dataset": "multi30k", "src_lang": "en", "tgt_lang": "de", "valid_set": "val",
                                  "test_sets": ["test_2016_flickr"], "limit_train_pairs": 50}, MIRROR)
    assert result.returncode == 0, result.stderr
    corpus = tmp_path / "data" / "corpus"
    assert sorted(p.name for p in corpus.iterdir()) == [
        "stats.json", "test_2016_flickr.de", "test_2016_flickr.en", "train.de", "train.en", "val.de", "val.en"]
    assert len((corpus / "train.de").read_text(encoding="utf-8").splitlines()) == 50
    assert "train" in result.stdout and "29000" in result.stdout and "1014" in result.stdout
    assert (tmp_path / "data" / "cache").is_dir()


@pytest.mark.pipeline
def test_bad_param_exits_2_with_one_line(tmp_path):
    result = run_stage(tmp_path, {"dataset": "nope"}, None)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: ") and "data.dataset 'nope'" in result.stderr
    assert not (tmp_path / "data").exists()


@pytest.mark.pipeline
def test_data_error_exits_2_with_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    result = run_stage(tmp_path, {"dataset": "multi30k"}, tmp_path / "empty")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: data mirror ") and "has no data/task1/raw/train.en.gz" in result.stderr
    assert not (tmp_path / "data" / "corpus").exists()


def test_format_table():
    dropped = {"empty": 1, "too_long": 2, "ratio": 3, "limit": 4}
    table = format_table({"splits": {"train": {"raw": 10, "kept": 0, "dropped": dropped},
                                     "test_2016_flickr": {"raw": 5, "kept": 5, "dropped": dict.fromkeys(dropped, 0)}}})
    header, train, test = table.splitlines()
    assert header.split() == ["split", "raw", "kept", "empty", "too_long", "ratio", "limit"]
    assert train.split() == ["train", "10", "0", "1", "2", "3", "4"]
    assert test.split()[:3] == ["test_2016_flickr", "5", "5"]


@pytest.mark.pipeline
def test_failed_download_under_dvc_repro_keeps_the_previous_corpus(tmp_path):
    """DVC deletes a stage's outputs before running it unless they persist: data/corpus persists,
    and the stage replaces it atomically, so a download that fails leaves the last good corpus."""
    if not (MIRROR / "data/task1/raw/train.en.gz").is_file():
        pytest.skip(f"the Multi30k mirror is not at {MIRROR}")
    root, env = make_workspace(tmp_path / "repo", tiny_params())
    dvc = Path(sys.executable).parent / "dvc"

    def repro(**extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(dvc), "repro", "download"], cwd=root, env={**env, **extra},
                              capture_output=True, text=True, timeout=300)

    first = repro()
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    before = {p.name: p.read_bytes() for p in (root / "data" / "corpus").iterdir()}

    params = yaml.safe_load((root / "params.yaml").read_text())
    params["data"]["limit_train_pairs"] = 200           # a change that reruns the stage...
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (tmp_path / "empty").mkdir()
    shutil.rmtree(root / "data" / "cache")
    failed = repro(DATA_MIRROR=str(tmp_path / "empty"))  # ...whose download fails
    assert failed.returncode != 0
    assert "has no data/task1/raw/" in failed.stderr
    after = {p.name: p.read_bytes() for p in (root / "data" / "corpus").iterdir()}
    assert after == before
