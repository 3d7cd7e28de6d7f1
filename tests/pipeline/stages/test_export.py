"""The export stage (pipeline/stages/export.py): the averaged model as a CTranslate2 model, the same
bytes from every run of the same model (DVC records one hash), one line and exit 2 without a model."""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipeline.config import paths
from transformer.checkpoint import model_checkpoint, save_checkpoint
from transformer.config import build_config
from transformer.model import Transformer
from transformer.tokenizer import train_tokenizer

REPO = Path(__file__).resolve().parents[3]
VOCAB = 24
pytestmark = pytest.mark.pipeline   # the stage as a subprocess


def run_stage(cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "pipeline.stages.export"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def test_two_exports_of_one_model_are_byte_identical(tmp_path):
    rng = random.Random(0)
    texts = [" ".join("".join(rng.choice("abcdefgh") for _ in range(rng.randint(1, 4))) for _ in range(8))
             for _ in range(300)]
    train_tokenizer(texts, tmp_path / paths.TOKENIZER_MODEL, vocab_size=VOCAB)
    torch.manual_seed(0)
    save_checkpoint(tmp_path / paths.AVERAGED_MODEL, model_checkpoint(Transformer(build_config("tiny", VOCAB))))

    first = run_stage(tmp_path)
    assert first.returncode == 0, first.stderr
    out = tmp_path / paths.CT2_MODEL
    once = digests(out)
    assert set(once) == {"model.bin", "config.json", "shared_vocabulary.json", "spm.model"}
    second = run_stage(tmp_path)   # another process: nothing of the run (time, memory layout) in the bytes
    assert second.returncode == 0, second.stderr
    assert digests(out) == once
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]   # no staged leftovers


def test_without_the_averaged_model_one_line_and_exit_2(tmp_path):
    result = run_stage(tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {paths.AVERAGED_MODEL} does not exist: run the earlier stages first (dvc repro)"]
