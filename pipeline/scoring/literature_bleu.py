"""BLEU as published Multi30k results measure it: lowercased, punctuation-normalized, Moses-tokenized
hypotheses against upstream's ``lc.norm.tok`` references (``bleu_lc_tok``).

Multi30k's repository (github.com/multi30k/dataset) ships tokenized references,
``data/task1/tok/<split>.lc.norm.tok.<lang>``, made by its ``scripts/task1-tokenize.sh``::

    zcat raw/<split>.<lang>.gz | lowercase.perl | normalize-punctuation.perl -l <lang> | tokenizer.perl -l <lang>

and the papers (Wu et al. 2021's 41.02 on test_2016_flickr among them) score hypotheses put through the
same three scripts with ``multi-bleu.perl`` against those files. Here: ``pipeline.text.moses.lc_norm_tok``
(the three scripts via sacremoses, the module says how) and ``paper_bleu.multi_bleu`` (multi-bleu.perl:
whitespace tokens, no smoothing), with no further tokenization. Put through ``lc_norm_tok``, the raw val
and test_2016_flickr references in English, German and French equal upstream's files line for line
(tests/pipeline/scoring/test_literature_bleu.py).

The measure reports, it never chooses: sacreBLEU (cased, detokenized) on the validation set ranks
decoding settings, recipes and the champion. Never compare the two with each other. The one exception:
a model of the literature's text form writes no cased text, and ``bleu_lc_tok`` of its hypotheses as
written (``score_as_written``) is all there is to choose by (``pipeline.scoring.measure``).
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

import sacrebleu

from pipeline.scoring.paper_bleu import PaperBleu, multi_bleu
from pipeline.scoring.reports import LITERATURE_KEY as KEY
from pipeline.scoring.reports import LITERATURE_LABEL as LABEL
from pipeline.scoring.sacrebleu_scores import bootstrap_ci
from pipeline.text.moses import lc_norm_tok


def describe(lang: str, references: str) -> str:
    """The label and what was done, with library versions: report it beside the score."""
    return (f"{LABEL}: hypotheses lowercased, punctuation-normalized (normalize-punctuation.perl -l {lang}) and "
            f"tokenized (tokenizer.perl -l {lang}, escape on, no -a) via sacremoses "
            f"{importlib.metadata.version('sacremoses')}; references {references}; BLEU as multi-bleu.perl "
            f"(sacrebleu {sacrebleu.__version__} tokenize=none, smooth=none)")


def bleu_lc_tok(hypotheses: list[str], tokenized_references: list[str], lang: str,
                references: str = "upstream lc.norm.tok") -> PaperBleu:
    """Corpus BLEU of detokenized ``hypotheses`` against already lowercased and tokenized references
    (upstream's ``lc.norm.tok`` lines, used as they are). ``references`` names them in the description.

    Raises ``ValueError`` when the two lists differ in length or are empty.
    """
    return _bleu_of_tokenized(lc_norm_tok(hypotheses, lang), tokenized_references, lang, references)


def _bleu_of_tokenized(tokenized_hypotheses: list[str], tokenized_references: list[str], lang: str,
                       references: str) -> PaperBleu:
    """``bleu_lc_tok`` of hypotheses already put through ``lc_norm_tok``."""
    if len(tokenized_hypotheses) != len(tokenized_references):
        raise ValueError(f"{KEY}: {len(tokenized_hypotheses)} hypotheses but {len(tokenized_references)} references")
    if not tokenized_references:
        raise ValueError(f"{KEY}: no sentences to score")
    b = multi_bleu(tokenized_hypotheses, list(tokenized_references))
    return PaperBleu(score=float(b.score), description=describe(lang, references), counts=tuple(b.counts),
                     totals=tuple(b.totals), bp=float(b.bp), sys_len=int(b.sys_len), ref_len=int(b.ref_len))


def literature_score(hypotheses: list[str], tokenized_references: list[str], lang: str,
                     references: str, bootstrap: int = 0) -> dict[str, Any]:
    """``{bleu_lc_tok, bleu_lc_tok_description}``: the entries a report gets beside sacreBLEU's; with
    ``bootstrap`` > 1 also ``bleu_lc_tok_ci95``, the half-width of its 95% confidence interval over that
    many resamples of the sentences (sacreBLEU's bootstrap, as for the cased BLEU)."""
    tokenized = lc_norm_tok(hypotheses, lang)  # once, for the score and its bootstrap
    result = _bleu_of_tokenized(tokenized, tokenized_references, lang, references)
    scores: dict[str, Any] = {KEY: round(result.score, 2)}
    if bootstrap > 1:
        metric = sacrebleu.BLEU(smooth_method="none", tokenize="none", lowercase=False, force=True)
        _, half_width = bootstrap_ci(metric, tokenized, list(tokenized_references), bootstrap)
        scores[f"{KEY}_ci95"] = round(half_width, 2)
    return {**scores, f"{KEY}_description": result.description}


def score_as_written(hypotheses: list[str], tokenized_references: list[str], bootstrap: int = 0, *, lang: str,
                     references: str) -> dict[str, Any]:
    """The scores of a model that writes the literature's form itself (``pipeline.text.forms``'s
    ``lc_norm_tok``): its hypotheses against the ``lc.norm.tok`` references *as they are*, never
    tokenized a second time (that would escape ``&apos;`` into ``&amp;apos;``). The keys of
    ``sacrebleu_scores.score`` (``bleu``, ``chrf``, ``length_ratio``, ``signature``, ``chrf_signature``,
    with ``bootstrap`` > 1 ``bleu_ci95``), where ``bleu`` *is* ``bleu_lc_tok`` (also given under its own
    name, with its description): such a model has no cased, detokenized output to score with sacreBLEU."""
    result = _bleu_of_tokenized(list(hypotheses), tokenized_references, lang, references)
    description = (f"{LABEL}: hypotheses as the model writes them (lowercased, normalized, Moses-tokenized "
                   f"text, not tokenized again); references {references}; BLEU as multi-bleu.perl (sacrebleu "
                   f"{sacrebleu.__version__} tokenize=none, smooth=none)")
    chrf = sacrebleu.CHRF(lowercase=True)
    bleu = round(result.score, 2)
    scores: dict[str, Any] = {"bleu": bleu, KEY: bleu,
                              "chrf": round(chrf.corpus_score(list(hypotheses), [list(tokenized_references)]).score, 2),
                              "length_ratio": round(result.sys_len / result.ref_len, 3) if result.ref_len else 0.0}
    if bootstrap > 1:
        metric = sacrebleu.BLEU(smooth_method="none", tokenize="none", lowercase=False, force=True)
        half_width = round(bootstrap_ci(metric, list(hypotheses), list(tokenized_references), bootstrap)[1], 2)
        scores.update({"bleu_ci95": half_width, f"{KEY}_ci95": half_width})
    return {**scores, "signature": description, "chrf_signature": str(chrf.get_signature()),
            f"{KEY}_description": description, "measure": KEY}
