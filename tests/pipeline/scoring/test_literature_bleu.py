"""The literature's BLEU (pipeline/scoring/literature_bleu.py): the tokenizer reproduces upstream's
``lc.norm.tok`` reference files from the raw references, and known scores of hand-counted pairs."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import pytest
import sacrebleu

from pipeline.scoring.literature_bleu import KEY, LABEL, bleu_lc_tok, lc_norm_tok, literature_score, score_as_written
from pipeline.scoring.paper_bleu import multi_bleu
from pipeline.scoring.reports import LITERATURE_KEY, LITERATURE_LABEL

pytestmark = pytest.mark.fast

MIRROR = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "multi30k" / "data" / "task1"


def read_lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return f.read().rstrip("\n").split("\n")


@pytest.mark.skipif(not (MIRROR / "tok").is_dir(), reason=f"the Multi30k mirror is not at {MIRROR}")
@pytest.mark.parametrize("split", ["val", "test_2016_flickr"])
@pytest.mark.parametrize("lang", ["de", "en", "fr"])
def test_the_tokenizer_reproduces_upstreams_reference_files(split, lang):
    """The raw references through ``lc_norm_tok`` equal upstream's files (made by task1-tokenize.sh with
    the Perl scripts) line for line: 0 differing lines of 1014 (val) and 1000 (test) in each language.

    Two Perl details make it 0 (without them: 1 line of val.de, 1 of val.fr, 1 of test_2016_flickr.fr
    differ): normalize-punctuation.perl sees each line with its newline (a sentence-final period moves out
    of a closing quote: ``tea.“`` -> ``tea " .``), and it maps ``’`` to ``"`` (``d’œil`` -> ``d " œil``),
    sacremoses' ``perl_parity``."""
    raw = read_lines(MIRROR / "raw" / f"{split}.{lang}.gz")
    upstream = read_lines(MIRROR / "tok" / f"{split}.lc.norm.tok.{lang}")
    assert len(raw) == len(upstream) == (1014 if split == "val" else 1000)
    differing = [i + 1 for i, (ours, theirs) in enumerate(zip(lc_norm_tok(raw, lang), upstream)) if ours != theirs]
    assert differing == []


def test_the_perl_details_reproduced():
    """The lines upstream's scripts treat unlike sacremoses' defaults (val.de 656, val.fr 861,
    test_2016_flickr.fr 694 upstream), and the rest of the three scripts: lowercase, quotes, escaping."""
    assert lc_norm_tok(["Ein Schild: „Come on now ... what's gayer than tea.“"], "de") == [
        "ein schild : &quot; come on now ... what &apos; s gayer than tea &quot; ."]
    assert lc_norm_tok(["Une femme jette un coup d’œil dans un télescope."], "fr") == [
        "une femme jette un coup d &quot; œil dans un télescope ."]
    assert lc_norm_tok(['Un homme qui s\'appelle "32 De Neude."'], "fr") == [
        "un homme qui s&apos; appelle &quot; 32 de neude &quot; ."]
    assert lc_norm_tok(["Der Hund & die Katze <spielen>."], "de") == ["der hund &amp; die katze &lt; spielen &gt; ."]
    # a period inside the line is left where it is (the rule needs the quote at the end of a sentence)
    assert lc_norm_tok(['Er sagt "Hallo." und geht.'], "en") == ["er sagt &quot; hallo . &quot; und geht ."]


def test_a_hand_counted_score():
    """hyp ``ein mann fährt ein rotes fahrrad .`` (7 tokens) against ``ein mann fährt ein fahrrad .`` (6):
    matches 6/7, 4/6, 2/5, 1/4, no brevity penalty: BLEU = (6*4*2*1 / (7*6*5*4))^(1/4) = (2/35)^(1/4)."""
    result = bleu_lc_tok(["Ein Mann fährt ein rotes Fahrrad."], ["ein mann fährt ein fahrrad ."], "de")
    assert (result.counts, result.totals) == ((6, 4, 2, 1), (7, 6, 5, 4))
    assert (result.sys_len, result.ref_len, result.bp) == (7, 6, 1.0)
    assert result.score == pytest.approx(100 * (2 / 35) ** 0.25)   # 48.89
    reported = literature_score(["Ein Mann fährt ein rotes Fahrrad."], ["ein mann fährt ein fahrrad ."], "de",
                                "ref.de")
    assert set(reported) == {KEY, f"{KEY}_description"} and reported[KEY] == 48.89
    assert "; references ref.de;" in reported[f"{KEY}_description"]


def test_casing_and_quotes_do_not_cost_what_sacrebleu_charges():
    """A hypothesis whose only differences from the reference are casing and quote style scores 100
    here; cased sacreBLEU against the raw reference charges both."""
    hypothesis, raw_reference = 'EIN Mann sagt: "Hallo."', "Ein Mann sagt: „Hallo.“"
    reference = lc_norm_tok([raw_reference], "de")
    assert reference == ["ein mann sagt : &quot; hallo &quot; ."]
    assert bleu_lc_tok([hypothesis], reference, "de").score == pytest.approx(100.0)
    assert sacrebleu.corpus_bleu([hypothesis], [[raw_reference]]).score < 50


def test_brevity_penalty_and_zero():
    """Half the reference's tokens, all matching: BP = exp(1 - 8/4) = exp(-1). No 4-gram match: 0."""
    result = bleu_lc_tok(["Zwei Hunde spielen."], ["zwei hunde spielen im schnee und laufen ."], "de")
    assert (result.counts, result.totals) == ((4, 2, 1, 0), (4, 3, 2, 1))
    assert result.score == 0.0
    result = bleu_lc_tok(["Zwei Hunde spielen im"], ["zwei hunde spielen im schnee und laufen ."], "de")
    assert (result.counts, result.totals) == ((4, 3, 2, 1), (4, 3, 2, 1))
    assert result.bp == pytest.approx(math.exp(-1)) and result.score == pytest.approx(100 * math.exp(-1))


def test_the_label_and_what_is_refused():
    assert (KEY, LABEL) == (LITERATURE_KEY, LITERATURE_LABEL) == (
        "bleu_lc_tok", "lowercased, Moses-tokenized, vs upstream lc.norm.tok references (the literature's)")
    description = bleu_lc_tok(["a ."], ["a ."], "en", "https://example/val.lc.norm.tok.en").description
    assert description.startswith(LABEL) and "sacremoses" in description and "val.lc.norm.tok.en" in description
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        bleu_lc_tok(["a", "b"], ["a"], "en")
    with pytest.raises(ValueError, match="no sentences"):
        bleu_lc_tok([], [], "en")


def test_a_model_writing_the_literatures_form_is_scored_as_written_never_tokenized_twice():
    """A hypothesis already in lc.norm.tok form (``&apos;`` escaped) scores against the references as it
    is; put through the tokenizer again its escapes would be split and escaped (``&amp; apos ;``) and the
    match lost."""
    references = ["ein mann &apos;s hut , &quot; blau &quot; .", "zwei hunde &amp; ein ball ."]
    hypotheses = ["ein mann &apos;s hut , &quot; blau &quot; .", "zwei hunde &amp; ein ball !"]
    assert lc_norm_tok(hypotheses[:1], "de") == ["ein mann &amp; apos ; s hut , &amp; quot ; blau &amp; quot ; ."]
    scores = score_as_written(hypotheses, references, 100, lang="de", references="upstream lc.norm.tok")
    expected = round(multi_bleu(hypotheses, references).score, 2)
    assert scores["bleu"] == scores[KEY] == expected > bleu_lc_tok(hypotheses, references, "de").score + 20
    assert scores["measure"] == KEY and scores["signature"].startswith(LABEL)
    assert scores["bleu_ci95"] == scores[f"{KEY}_ci95"] >= 0
    assert scores["length_ratio"] == 1.0
    assert scores["chrf"] == round(sacrebleu.CHRF(lowercase=True).corpus_score(hypotheses, [references]).score, 2)
    assert "case:lc" in scores["chrf_signature"]
