"""``python -m pipeline.workers deploy`` refuses when dvc.yaml, dvc.lock, params.yaml or a stage's
code deps differ in the working tree from the commit it pins (the workers would not see those
changes), and with ``--allow-uncommitted`` only warns. The refusal comes before any server is asked."""

from __future__ import annotations

import subprocess

import pytest

from pipeline.workers.__main__ import main
from pipeline.workers.deploy import check_working_tree, uncommitted_changes

from .conftest import REPO

pytestmark = pytest.mark.service

DVC_YAML = """stages:
  train:
    cmd: python -m code.train
    deps:
      - code/train.py
      - code/lib
      - data/corpus
    params:
      - train
      - extra.yaml:
          - tune
"""


def git(root, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(root), "GIT_AUTHOR_NAME": "t",
                               "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                               "GIT_COMMITTER_EMAIL": "t@t"}).stdout.strip()


@pytest.fixture()
def repo(tmp_path):
    root = tmp_path / "repo"
    (root / "code" / "lib").mkdir(parents=True)
    (root / "dvc.yaml").write_text(DVC_YAML)
    for name, text in {"dvc.lock": "schema: '2.0'\n", "params.yaml": "train: {steps: 1}\n", "extra.yaml": "tune: 1\n",
                       "code/train.py": "print(1)\n", "code/lib/util.py": "X = 1\n", "README.md": "notes\n",
                       ".gitignore": "/data\n"}.items():
        (root / name).write_text(text)
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "pinned")
    git(tmp_path, "clone", "-q", "--bare", str(root), str(tmp_path / "served.git"))
    return root


def test_a_clean_tree_passes_and_unrelated_changes_do_not_count(repo):
    commit = git(repo, "rev-parse", "HEAD")
    (repo / "README.md").write_text("edited\n")
    (repo / "data").mkdir()
    (repo / "data" / "corpus").write_text("DVC's data, git-ignored\n")
    assert uncommitted_changes(commit, repo) == []
    assert check_working_tree(commit, insist=False, repo=repo) is None


def test_changes_the_workers_would_not_see_are_refused_or_warned(repo):
    commit = git(repo, "rev-parse", "HEAD")
    (repo / "dvc.lock").write_text("schema: '2.0'\nstages: {}\n")
    (repo / "extra.yaml").write_text("tune: 2\n")
    (repo / "code" / "lib" / "new.py").write_text("Y = 2\n")   # untracked, inside a dep folder
    (repo / "code" / "train.py").write_text("print(2)\n")
    git(repo, "add", "code/train.py")                           # staged counts too
    assert uncommitted_changes(commit, repo) == ["code/lib/new.py", "code/train.py", "dvc.lock", "extra.yaml"]
    with pytest.raises(ValueError, match="--allow-uncommitted"):
        check_working_tree(commit, insist=False, repo=repo)
    assert "dvc.lock" in check_working_tree(commit, insist=True, repo=repo)


def test_the_command_refuses_before_asking_any_server(repo, tmp_path, monkeypatch, capsys):
    (repo / "params.yaml").write_text("train: {steps: 2}\n")
    monkeypatch.chdir(repo)
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")   # nothing answers there: never reached
    code = main(["deploy", "--repository", str(tmp_path / "served.git"), "--pool", "gpu",
                 "--params", str(REPO / "params.yaml")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "params.yaml" in err and "the workers run the commit" in err and "--allow-uncommitted" in err
