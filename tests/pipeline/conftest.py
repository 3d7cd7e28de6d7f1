"""A real pipeline run for the stage, tracking and compare tests: ``dvc repro`` in a temporary
git+DVC workspace on 300 Multi30k pairs from the mirror, with a tiny model, a real SQLite
MLflow store and real sacrebleu."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from ..fakes import params_with

REPO = Path(__file__).resolve().parents[2]
MIRROR = REPO.parent / "shared" / "data" / "multi30k"
BIN = Path(sys.executable).parent
needs_mirror = pytest.mark.skipif(not (MIRROR / "data/task1/raw/train.en.gz").is_file(),
                                  reason=f"the Multi30k mirror is not at {MIRROR} (see shared/data/README.md)")

TINY = {
    "data": {"limit_train_pairs": 300},
    "tokenizer": {"vocab_size": 400},
    "model": {"preset": "tiny", "dropout": 0.1},
    "train": {"max_epochs": 0, "max_steps": 40, "max_tokens": 1024, "warmup_steps": 10, "lr_scale": 1.0,
              "checkpoint_every_steps": 10, "checkpoint_every_minutes": 0, "keep_checkpoints": 3,
              "log_every": 10, "validate_every": 20,
              "precision": "fp32", "device": "cpu"},
    "average": {"last_n": 3},
    # beam 4 (params.yaml's) x 2 alphas x both stopping rules on the first 200 validation sentences (the
    # whole set is the same code with more lines, and took 60% of the stage); CTranslate2's own 2 alphas,
    # then int8 at its point
    "tune": {"alphas": [0.6, 1.0], "stoppings": ["exact", "fairseq"], "ct2_alphas": [0.6, 1.2],
             "max_sentences": 200},
    # no attention plots (matplotlib's import and 6 figures: half the stage); the session workspace draws one
    "evaluate": {"beam_size": 2, "max_len_b": 8, "batch_sentences": 250, "attention_sentences": 0},
    "tracking": {"experiment": "test-experiment", "registered_model": "test-translator"},
}


@dataclass
class Workspace:
    path: Path
    env: dict[str, str]
    first_run: subprocess.CompletedProcess
    second_repro: subprocess.CompletedProcess | None = None
    first_lock: str = ""   # dvc.lock as the first run wrote it (later tests run experiments in the workspace)
    first_outputs: dict[str, str] = field(default_factory=dict)   # its report files (DVC outputs, not in git)
    first_params: str = ""  # params.yaml of the first run (an experiment leaves its own in the workspace)

    def run(self, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), cwd=self.path, env=self.env, capture_output=True, text=True,
                              timeout=timeout)

    def dvc(self, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
        return self.run(str(BIN / "dvc"), *args, timeout=timeout)

    @property
    def tracking_uri(self) -> str:
        return self.env["MLFLOW_TRACKING_URI"]


# For the tests about orchestration, tracking and storage, not decoding: tune tries one point per engine
# on the first 50 validation sentences and evaluate writes at most 4 pieces past each source (a tiny
# pipeline's tune and evaluate then take ~17 s of one core instead of ~31; they are still the real stages).
ONE_POINT_DECODING = {"tune": {**TINY["tune"], "beam_sizes": [1], "alphas": [0.6], "stoppings": ["fairseq"],
                               "ct2_alphas": [0.6], "max_sentences": 50},
                      "evaluate": {**TINY["evaluate"], "max_len_b": 4, "batch_sentences": 512}}


def tiny_params(overrides: dict | None = None) -> dict:
    return params_with({**TINY, **(overrides or {})})


def orchestration_params(overrides: dict | None = None) -> dict:
    """The tiny params with ``ONE_POINT_DECODING``, and ``overrides`` (whole sections) on top."""
    return tiny_params({**ONE_POINT_DECODING, **(overrides or {})})


def session_params() -> dict:
    """The session workspace's params: the tiny ones, with one sentence's attention drawn."""
    return tiny_params({"evaluate": {**TINY["evaluate"], "attention_sentences": 1}})


def make_workspace(root: Path, params: dict) -> tuple[Path, dict[str, str]]:
    """A git + DVC repository holding the project's code, dvc.yaml and the given params."""
    root.mkdir(parents=True, exist_ok=True)
    for item in ("pipeline", "transformer"):
        shutil.copytree(REPO / item, root / item, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "dvc.yaml", root / "dvc.yaml")
    (root / "data" / "incoming").mkdir(parents=True)   # a dependency of the download stage
    shutil.copy(REPO / "data" / "incoming" / "README.md", root / "data" / "incoming" / "README.md")
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "DVC_"))}
    env.update(PYTHONPATH=str(root), DATA_MIRROR=str(MIRROR), PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
               MLFLOW_TRACKING_URI=f"sqlite:///{root / 'mlflow.db'}", GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t", OMP_NUM_THREADS="1")
    for cmd in (["git", "init", "-q", "-b", "main"], [str(BIN / "dvc"), "init", "-q"],
                [str(BIN / "dvc"), "config", "core.analytics", "false"],
                ["git", "add", "-A"], ["git", "commit", "-qm", "workspace"]):
        subprocess.run(cmd, cwd=root, env=env, check=True, capture_output=True)
    return root, env


@pytest.fixture(scope="session")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    """The whole pipeline, run once for the session with ``dvc repro``."""
    if not (MIRROR / "data/task1/raw/train.en.gz").is_file():
        pytest.skip(f"the Multi30k mirror is not at {MIRROR}")
    path, env = make_workspace(tmp_path_factory.mktemp("pipeline") / "repo", session_params())
    ws = Workspace(path, env, None)  # type: ignore[arg-type]
    ws.first_run = ws.dvc("repro", timeout=600)
    assert ws.first_run.returncode == 0, ws.first_run.stdout[-3000:] + ws.first_run.stderr[-3000:]
    ws.first_lock = (path / "dvc.lock").read_text()
    ws.first_params = (path / "params.yaml").read_text()
    ws.first_outputs = {str(f.relative_to(path)): f.read_text()
                        for pattern in ("*.*", "*/*.json") for f in (path / "reports").glob(pattern)}
    ws.run("git", "add", "-A")
    ws.run("git", "commit", "-qm", "first run")
    ws.second_repro = ws.dvc("repro")
    return ws


@pytest.fixture(scope="session")
def beam1_experiment(workspace: Workspace) -> subprocess.CompletedProcess:
    """``dvc exp run -S evaluate.beam_size=1`` on top of the first run (greedy decoding)."""
    result = workspace.dvc("exp", "run", "-S", "evaluate.beam_size=1", timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result
