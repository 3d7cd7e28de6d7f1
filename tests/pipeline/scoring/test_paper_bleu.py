"""BLEU as the paper measured it (pipeline/scoring/paper_bleu.py): hand-counted n-gram matches and scores,
the compound split's Perl semantics, and the direction of its difference from sacreBLEU."""

from __future__ import annotations

import importlib.metadata
import math

import pytest
import sacrebleu

from pipeline.scoring.paper_bleu import (
    PaperBleu,
    bleu_tok_compound_split,
    main,
    moses_tokenize,
    multi_bleu,
    split_compounds,
)

pytestmark = pytest.mark.fast

MERCEDES_REF = "Der neue Mercedes-Benz ist heute in Stuttgart vorgestellt worden."
MERCEDES_HYP = "Der neue Mercedes ist heute in Stuttgart vorgestellt worden."


def test_identical_text_scores_100():
    refs = ["Die Mercedes-Benz-Aktie stieg am Montag um 3,5 Prozent.", 'Er sagte: "Das ist AT&T\'s <Ziel>."']
    result = bleu_tok_compound_split(refs, refs, "de")
    assert result.score == pytest.approx(100.0)
    assert result.bp == 1.0 and result.counts == result.totals


def test_split_turns_a_zero_score_into_65_8():
    """Tokens (Moses keeps hyphenated words whole, splits the final period):
    ref  Die Mercedes-Benz-Aktie stieg am Montag .   hyp  ... fiel ...   -> no 4-gram matches: 0.
    Split: Die Mercedes ##AT##-##AT## Benz ##AT##-##AT## Aktie fiel am Montag . (10 tokens, the 7th
    wrong): matches 9/10, 7/9, 5/8, 3/7, BP 1: BLEU = (9*7*5*3 / (10*9*8*7))^(1/4) = (3/16)^(1/4)."""
    ref, hyp = ["Die Mercedes-Benz-Aktie stieg am Montag."], ["Die Mercedes-Benz-Aktie fiel am Montag."]
    assert moses_tokenize(ref, "de") == ["Die Mercedes-Benz-Aktie stieg am Montag ."]
    assert multi_bleu(moses_tokenize(hyp, "de"), moses_tokenize(ref, "de")).score == 0.0

    result = bleu_tok_compound_split(hyp, ref, "de")
    assert (result.counts, result.totals) == ((9, 7, 5, 3), (10, 9, 8, 7))
    assert result.score == pytest.approx(100 * (3 / 16) ** 0.25)   # 65.80
    # sacreBLEU on the detokenized text: 13a keeps "Mercedes-Benz-Aktie" whole, and only its
    # default exp smoothing (0/3 4-grams counted as 1/6) keeps it above 0: 37.99
    assert sacrebleu.corpus_bleu(hyp, [ref]).score == pytest.approx(100 * (5 / 6 * 3 / 5 * 1 / 4 * 1 / 6) ** 0.25)
    assert sacrebleu.corpus_bleu(hyp, [ref]).score < result.score - 25


def test_split_adds_matches_but_the_brevity_penalty_can_cost_more():
    """A hypothesis without the compound's second half.
    Tokenized only (10 tokens each): matches 9/10, 7/9, 5/8, 4/7, BP 1 -> (1/4)^(1/4) = 1/sqrt(2).
    Split, the reference has 12 tokens: "Mercedes" now matches (10/10, 8/9, 6/8, 4/7) but
    BP = exp(1 - 12/10): BLEU = (8/21)^(1/4) * exp(-0.2)."""
    tokenized = multi_bleu(moses_tokenize([MERCEDES_HYP], "de"), moses_tokenize([MERCEDES_REF], "de"))
    assert (tokenized.counts, tokenized.totals) == ([9, 7, 5, 4], [10, 9, 8, 7])
    assert tokenized.score == pytest.approx(100 / math.sqrt(2))

    result = bleu_tok_compound_split([MERCEDES_HYP], [MERCEDES_REF], "de")
    assert (result.counts, result.totals) == ((10, 8, 6, 4), (10, 9, 8, 7))
    assert (result.sys_len, result.ref_len) == (10, 12)
    assert result.bp == pytest.approx(math.exp(-0.2))
    assert result.score == pytest.approx(100 * (8 / 21) ** 0.25 * math.exp(-0.2))   # 64.32


def test_without_hyphens_it_equals_sacrebleu_unsmoothed():
    """Where Moses and 13a tokenize alike and nothing is hyphenated, the two measures agree:
    matches 8/8, 6/7, 4/6, 2/5, BP exp(1 - 9/8) -> (8/35)^(1/4) * exp(-1/8) = 61.02."""
    hyp, ref = ["Der Hund läuft heute schnell nach Hause."], ["Der Hund läuft heute sehr schnell nach Hause."]
    result = bleu_tok_compound_split(hyp, ref, "de")
    assert result.score == pytest.approx(100 * (8 / 35) ** 0.25 * math.exp(-1 / 8))
    assert result.score == pytest.approx(sacrebleu.corpus_bleu(hyp, [ref], smooth_method="none").score)


def test_higher_than_sacrebleu_on_hyphenated_german():
    """The direction of the known gap (paper-style BLEU above sacreBLEU on WMT14 EN-DE): the split
    turns each correct hyphenated word into three matching tokens and more matching n-grams."""
    refs = ["Die Mercedes-Benz-Aktie stieg am Montag in Stuttgart deutlich.",
            "Der E-Mail-Verkehr zwischen Berlin und Paris wurde gestern überwacht.",
            "Die Nato-Truppen bleiben bis 2014 im Land, sagte der Minister."]
    hyps = ["Die Mercedes-Benz-Aktie fiel am Montag in Stuttgart deutlich.",
            "Der E-Mail-Verkehr zwischen Berlin und Paris wurde heute überwacht.",
            "Die Nato-Truppen bleiben bis 2014 in dem Land, sagte ein Minister."]
    paper = bleu_tok_compound_split(hyps, refs, "de").score
    detok = sacrebleu.corpus_bleu(hyps, [refs]).score
    tokenized_only = multi_bleu(moses_tokenize(hyps, "de"), moses_tokenize(refs, "de")).score
    assert paper > tokenized_only > 0 and paper > detok + 3


@pytest.mark.parametrize(("line", "split"), [
    ("Mercedes-Benz", "Mercedes ##AT##-##AT## Benz"),
    ("a-b-c", "a ##AT##-##AT## b-c"),              # Perl's s///g: matches do not overlap
    ("Mercedes-Benz-Aktie", "Mercedes ##AT##-##AT## Benz ##AT##-##AT## Aktie"),
    ("a-b c-d", "a ##AT##-##AT## b c ##AT##-##AT## d"),
    ("über-groß", "über ##AT##-##AT## groß"),       # non-ASCII characters are \S (bytes in Perl)
    ("a - b", "a - b"), ("-a", "-a"), ("a-", "a-"), ("1-2", "1 ##AT##-##AT## 2"),
])
def test_split_compounds_is_get_ende_bleu_s_regex(line, split):
    assert split_compounds(line) == split


def test_moses_defaults_as_tokenizer_perl():
    """tokenizer.perl -l de without -a or -no-escape: hyphens kept, XML characters escaped."""
    assert moses_tokenize(['Er sagte: "AT&T-Aktien <steigen>."'], "de") == [
        "Er sagte : &quot; AT &amp; T-Aktien &lt; steigen &gt; . &quot;"]


def test_description_names_what_was_done():
    result = bleu_tok_compound_split(["Hallo Welt, wie geht es?"], ["Hallo Welt, wie geht es?"], "de")
    assert isinstance(result, PaperBleu)
    version = importlib.metadata.version("sacremoses")
    assert result.description == (
        f"tokenized (Moses tokenizer.perl -l de via sacremoses {version}, escape on, no -a) + compound splitting "
        f"##AT## (tensor2tensor get_ende_bleu.sh), BLEU as multi-bleu.perl (sacrebleu {sacrebleu.__version__} "
        f"tokenize=none, smooth=none, cased)")
    assert str(result).startswith(
        "BLEU = 100.00, 100.0/100.0/100.0/100.0 (BP=1.000, ratio=1.000, hyp_len=7, ref_len=7) [tokenized (Moses")


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        bleu_tok_compound_split(["a", "b"], ["a"], "de")
    with pytest.raises(ValueError, match="no sentences"):
        bleu_tok_compound_split([], [], "de")


def test_cli(tmp_path, capsys):
    (tmp_path / "hyp").write_text(MERCEDES_HYP + "\n", encoding="utf-8")
    (tmp_path / "ref").write_text(MERCEDES_REF + "\n", encoding="utf-8")
    assert main([str(tmp_path / "hyp"), str(tmp_path / "ref")]) == 0
    assert capsys.readouterr().out.startswith("BLEU = 64.32, 100.0/88.9/75.0/57.1 (BP=0.819, ratio=0.833, ")
    assert main([str(tmp_path / "hyp"), str(tmp_path / "missing")]) == 1
