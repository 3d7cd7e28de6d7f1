"""A small decoding workspace for the tune and evaluate stages run in-process: the files those stages
read (a tiny random model, its SentencePiece model, the export stage's CTranslate2 model of it, a
validation and a test set) in a folder the test works in, and the params to run them with. Tracking
off: what is tested is what the stages decode and write."""

from __future__ import annotations

import random
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from pipeline.config.data import DataParams
from pipeline.config.decoding import EvaluateParams, TuneParams
from pipeline.config.loader import Sections, load_sections
from pipeline.config.tracking import TrackingParams
from pipeline.serving.export import export_ctranslate2
from transformer.checkpoint import model_checkpoint, save_checkpoint
from transformer.config import build_config
from transformer.model import Transformer
from transformer.tokenizer import train_tokenizer

from ...fakes import params_with

VOCAB = 48
SENTENCES = 12   # per set: well under a second for every grid point of both engines

# Both grids small (torch: 1 + 2 points; CTranslate2: 1 + 2 points, its own alphas, and int8 once).
SMALL = {"tune": {"beam_sizes": [1, 2], "alphas": [1.0], "stoppings": ["exact", "fairseq"],
                  "ct2_alphas": [0.6, 1.0]},
         "evaluate": {"max_len_b": 6, "batch_sentences": 8, "attention_sentences": 1},
         "tracking": {"experiment": "decoding-workspace", "registered_model": "decoding-workspace"}}


def _lines(rng: random.Random, n: int) -> list[str]:
    return [" ".join("".join(rng.choice("abcdefghij") for _ in range(rng.randint(1, 4)))
                     for _ in range(rng.randint(2, 7))) for _ in range(n)]


@pytest.fixture(scope="module")
def decoding_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stages' inputs, once per module: models/model.pt (the tiny preset, random weights),
    models/ctranslate2 (its export), data/tokenizer/spm.model, data/corpus/{val,test_2016_flickr}.{en,de}."""
    root = tmp_path_factory.mktemp("decoding-workspace")
    rng = random.Random(0)
    corpus = root / "data" / "corpus"
    corpus.mkdir(parents=True)
    for split in ("val", "test_2016_flickr"):
        for lang in ("en", "de"):
            (corpus / f"{split}.{lang}").write_text("".join(f"{s}\n" for s in _lines(rng, SENTENCES)))
    (root / "data" / "tokenizer").mkdir()
    tokenizer = root / "data" / "tokenizer" / "spm.model"
    train_tokenizer(_lines(rng, 600), tokenizer, VOCAB)
    torch.manual_seed(0)
    model = Transformer(build_config("tiny", VOCAB)).eval()
    (root / "models").mkdir()
    save_checkpoint(root / "models" / "model.pt", model_checkpoint(model))
    export_ctranslate2(model, tokenizer, root / "models" / "ctranslate2")
    return root


@pytest.fixture
def decoding_workspace(decoding_files: Path, tmp_path: Path,
                       monkeypatch: pytest.MonkeyPatch) -> Callable[..., Sections]:
    """A copy of ``decoding_files`` as the working directory; call it with params sections (merged
    into ``SMALL``) for the stages' ``Sections``."""
    shutil.copytree(decoding_files, tmp_path / "ws")
    monkeypatch.chdir(tmp_path / "ws")
    monkeypatch.setenv("PIPELINE_TRACKING", "off")

    def params(**sections: dict) -> Sections:
        merged = {name: {**SMALL.get(name, {}), **sections.get(name, {})} for name in {*SMALL, *sections}}
        return load_sections(DataParams, TuneParams, EvaluateParams, TrackingParams, raw=params_with(merged))

    return params
