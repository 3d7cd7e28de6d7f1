"""The WMT14 path end to end at CI size: a WMT14-shaped mirror (the five statmt archives under their
real names and member paths, tests/wmt14_fixture.py) served from 127.0.0.1 over HTTP, and the real
``dvc repro`` with ``params/wmt14_en_de_base.yaml`` and small overrides (tiny preset, a few updates),
down to ``reports/metrics.json`` scored on newstest2014 with sacreBLEU and the paper's tokenized BLEU.

It proves that the recipe parses, the registry's member names and the SGML reader work on the
archives' layout, the cleaning counts are reported, and a second repro is a no-op (the corpus's
identity does not depend on whether its hashes were known before).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.wmt14_fixture import generate

from ..fakes import range_server
from .conftest import make_workspace

pytestmark = pytest.mark.pipeline

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

OVERRIDES = {
    "data": {"incoming_dir": ""},
    "tokenizer": {"vocab_size": 600, "input_sentence_size": 4000},
    "model": {"preset": "tiny"},
    "train": {"max_steps": 6, "max_tokens": 1024, "warmup_steps": 4, "checkpoint_every_steps": 3,
              "keep_checkpoints": 2, "log_every": 3, "validate_every": 0, "precision": "fp32", "device": "cpu"},
    "average": {"last_n": 2},
    "tune": {"max_sentences": 50},
    "evaluate": {"max_len_b": 6, "batch_sentences": 200, "attention_sentences": 1},
    "tracking": {"experiment": "test-wmt14", "registered_model": "test-wmt14"},
}


def recipe_with_overrides() -> dict:
    params = yaml.safe_load((REPO / "params" / "wmt14_en_de_base.yaml").read_text())
    for section, values in OVERRIDES.items():
        params[section] = {**params.get(section, {}), **values}
    return params


def test_wmt14_recipe_runs_every_stage_on_wmt14_shaped_archives(tmp_path):
    mirror = tmp_path / "statmt"
    fixture = generate(mirror, pairs=2000, seed=3, dev=150, test=200)
    root, env = make_workspace(tmp_path / "repo", recipe_with_overrides())
    with range_server(mirror, cut_once=set()) as (url, requests):
        env = {**env, "DATA_MIRROR": url, "DATA_CHECKSUMS": str(tmp_path / "checksums.json"),
               "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}
        def dvc(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([str(BIN / "dvc"), *args], cwd=root, env=env, capture_output=True, text=True,
                                  timeout=300)

        first = dvc("repro")
        assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
        subprocess.run(["git", "add", "-A"], cwd=root, env=env, check=True, capture_output=True)
        subprocess.run(["git", "commit", "-qm", "first run"], cwd=root, env=env, check=True, capture_output=True)
        second = dvc("repro")
    assert second.returncode == 0 and "Running stage" not in second.stdout, second.stdout[-2000:]

    # every archive fetched once, from the mirror, under its statmt path
    fetched = sorted({path for path, _ in requests})
    assert fetched == sorted(f"/{name}" for name in fixture.archives)

    stats = json.loads((root / "data/corpus/stats.json").read_text())
    train = stats["splits"]["train"]
    assert train["raw"] == 2000 and train["corpora"].keys() == {"europarl-v7", "commoncrawl", "news-commentary-v9"}
    assert train["kept"] + sum(train["dropped"].values()) == 2000 and sum(train["dropped"].values()) > 0
    assert stats["splits"]["newstest2014"]["kept"] == 200
    refs = (root / "data/corpus/newstest2014.de").read_text(encoding="utf-8")
    assert "&amp;" not in refs and "&quot;" not in refs and "&" in refs      # SGML entities read as text

    metrics = json.loads((root / "reports/metrics.json").read_text())
    test = json.loads((root / "reports/evaluate/scores.json").read_text())["test"]["newstest2014"]
    assert test["sentences"] == 200 and 0 <= test["bleu"] <= 100 and test["signature"].startswith("nrefs:1")
    assert 0 <= test["bleu_tok_compound_split"] <= 100
    assert "compound splitting" in test["bleu_tok_compound_split_description"]
    # the headline: sacreBLEU and the paper's BLEU side by side, under their own names
    headline = ("bleu", "bleu_ci95", "chrf", "bleu_tok_compound_split")
    assert metrics["test"]["newstest2014"] == {k: test[k] for k in headline}
    assert metrics["decoding"]["alpha"] == 0.6 and metrics["decoding"]["beam_size"] == 4   # the recipe's one point
    recorded = json.loads((tmp_path / "checksums.json").read_text())
    assert recorded["sha256"] == {} and len(recorded["mirror_sha256"][url.rstrip("/")]) == 5
