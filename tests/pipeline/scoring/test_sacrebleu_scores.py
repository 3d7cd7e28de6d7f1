"""sacreBLEU's scores (pipeline/scoring/sacrebleu_scores.py): the corpus figures and BLEU's 95% confidence
interval from sacreBLEU's bootstrap, fixed by its seed whatever the environment says."""

from __future__ import annotations

import os

import pytest
import sacrebleu

from pipeline.scoring.literature_bleu import KEY, literature_score
from pipeline.scoring.sacrebleu_scores import BOOTSTRAP_SEED, bootstrap_ci, score

pytestmark = pytest.mark.fast

REFERENCES = ["Ein Mann fährt ein rotes Fahrrad.", "Zwei Hunde spielen im Schnee.", "Eine Frau liest ein Buch.",
              "Kinder spielen auf der Straße.", "Ein Hund läuft über die Wiese.", "Der Mann trägt einen Hut."] * 5
HYPOTHESES = ["Ein Mann fährt ein Fahrrad.", "Zwei Hunde spielen im Schnee.", "Eine Frau liest eine Zeitung.",
              "Kinder spielen auf einer Straße.", "Ein Hund rennt über das Gras.", "Ein Mann mit Hut."] * 5


def test_score_without_bootstrap_has_no_interval():
    result = score(HYPOTHESES, REFERENCES)
    assert result["bleu"] == round(sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES]).score, 2)
    assert "bleu_ci95" not in result
    assert "bs:" not in result["signature"]


def test_the_interval_is_sacrebleus_and_seeded(monkeypatch):
    """The half-width equals sacreBLEU's own bootstrap at the fixed seed, and another $SACREBLEU_SEED
    (which would change sacreBLEU's resamples) changes nothing here and is left as it was."""
    result = score(HYPOTHESES, REFERENCES, bootstrap=200)
    monkeypatch.setenv("SACREBLEU_SEED", BOOTSTRAP_SEED)
    expected = sacrebleu.BLEU().corpus_score(HYPOTHESES, [REFERENCES], n_bootstrap=200)
    assert result["bleu_ci95"] == round(expected._ci, 2)
    assert 0 < result["bleu_ci95"] < 30
    assert "|bs:200|seed:12345|" in result["signature"]
    monkeypatch.setenv("SACREBLEU_SEED", "7")
    assert score(HYPOTHESES, REFERENCES, bootstrap=200)["bleu_ci95"] == result["bleu_ci95"]
    assert os.environ["SACREBLEU_SEED"] == "7"
    other = sacrebleu.BLEU().corpus_score(HYPOTHESES, [REFERENCES], n_bootstrap=200)
    assert round(other._ci, 2) != result["bleu_ci95"]


def test_perfect_translations_have_no_spread():
    mean, half_width = bootstrap_ci(sacrebleu.BLEU(), REFERENCES, REFERENCES, 100)
    assert round(mean, 6) == 100.0 and half_width == 0.0


def test_the_literatures_measure_has_its_interval():
    tokenized = [line.lower().replace(".", " .") for line in REFERENCES]
    plain = literature_score(HYPOTHESES, tokenized, "de", "test references")
    with_ci = literature_score(HYPOTHESES, tokenized, "de", "test references", bootstrap=200)
    assert f"{KEY}_ci95" not in plain
    assert with_ci[KEY] == plain[KEY] and with_ci[f"{KEY}_description"] == plain[f"{KEY}_description"]
    assert 0 < with_ci[f"{KEY}_ci95"] < 30
