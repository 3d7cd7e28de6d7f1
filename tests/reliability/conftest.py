"""A small finished workspace for the reliability tests: tiny params, a synthetic corpus, and the
real tokenizer, train and average stages run on it once (one subprocess, a few seconds)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ..fakes import params_with, synthetic_corpus

REPO = Path(__file__).resolve().parents[2]
SPLITS = {"train": 120, "val": 12, "test_2016_flickr": 12}
TINY = {
    "tokenizer": {"vocab_size": 80},
    "model": {"preset": "tiny", "dropout": 0.1},
    "train": {"max_epochs": 0, "max_steps": 4, "max_minutes": 0, "max_tokens": 256, "warmup_steps": 2,
              "checkpoint_every_steps": 2, "checkpoint_every_minutes": 0, "keep_checkpoints": 3,
              "log_every": 2, "validate_every": 0,
              "precision": "fp32", "device": "cpu"},
    "average": {"last_n": 2},
    # Every setting tune would choose is set: the base workspace has no tune stage, and evaluate refuses
    # null settings without its report before it reads the checkpoint the cases below break.
    "evaluate": {"beam_size": 2, "alpha": 0.6, "stopping": "fairseq", "engine": "torch", "max_len_b": 5,
                 "batch_sentences": 64, "attention_sentences": 0, "precision": "fp32"},
    "tracking": {"experiment": "reliability", "registered_model": "reliability"},
}


def tiny_params(overrides: dict | None = None) -> dict:
    return params_with({**TINY, **(overrides or {})})


def stage_env(root: Path) -> dict[str, str]:
    """The environment a stage subprocess gets: this checkout's code, a tracking store in ``root``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "DVC_", "DATA_MIRROR"))}
    env.update(PYTHONPATH=str(REPO), MLFLOW_TRACKING_URI=f"sqlite:///{root / 'mlflow.db'}", OMP_NUM_THREADS="1")
    return env


@pytest.fixture(scope="session")
def base_workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """data/corpus, data/tokenizer, data/tokens, models/checkpoints (steps 2 and 4), models/model.pt."""
    root = tmp_path_factory.mktemp("base") / "ws"
    root.mkdir()
    (root / "params.yaml").write_text(yaml.safe_dump(tiny_params(), sort_keys=False))
    synthetic_corpus(root / "data" / "corpus", SPLITS)
    script = ("from pipeline.stages.runner import run_stage\n"
              "from pipeline.stages import tokenizer, train, average\n"
              "for stage in (tokenizer, train, average):\n"
              "    run_stage(stage.main)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=root, env=stage_env(root), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert (root / "models" / "model.pt").is_file()
    return root
