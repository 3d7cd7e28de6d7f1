"""BLEU as published Multi30k results measure it: lowercased, punctuation-normalized, Moses-tokenized
hypotheses against upstream's ``lc.norm.tok`` references (``bleu_lc_tok``).

Multi30k's repository (github.com/multi30k/dataset) ships tokenized references,
``data/task1/tok/<split>.lc.norm.tok.<lang>``, made by its ``scripts/task1-tokenize.sh``::

    zcat raw/<split>.<lang>.gz | lowercase.perl | normalize-punctuation.perl -l <lang> | tokenizer.perl -l <lang>

and the papers (Wu et al. 2021's 41.02 on test_2016_flickr among them) score hypotheses put through the
same three scripts with ``multi-bleu.perl`` against those files. Here: Python's ``str.lower`` for
``lowercase.perl`` (Perl's ``lc`` under ``:utf8``), sacremoses' ``MosesPunctNormalizer`` with
``perl_parity`` (``’`` -> ``"``, as the Moses scripts upstream ran) on the line *with* its newline
(Perl reads lines with it, and the rule that moves a sentence-final period out of a closing quote,
``s/(\\.+)\\"(\\s*[^<])/\\"$1$2/``, matches the newline as its last character), then
``paper_bleu.moses_tokenize`` (tokenizer.perl's defaults, escaping on) and ``paper_bleu.multi_bleu``
(multi-bleu.perl: whitespace tokens, no smoothing), with no further tokenization. Put through
``lc_norm_tok``, the raw val and test_2016_flickr references in English, German and French equal
upstream's files line for line (tests/pipeline/scoring/test_literature_bleu.py).

The measure reports, it never chooses: sacreBLEU (cased, detokenized) on the validation set ranks
decoding settings, recipes and the champion. Never compare the two with each other.
"""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Iterable
from typing import Any

import sacrebleu
from sacremoses import MosesPunctNormalizer

from pipeline.scoring.paper_bleu import PaperBleu, moses_tokenize, multi_bleu
from pipeline.scoring.reports import LITERATURE_KEY as KEY
from pipeline.scoring.reports import LITERATURE_LABEL as LABEL
from pipeline.scoring.sacrebleu_scores import bootstrap_ci


@functools.lru_cache(maxsize=8)
def _normalizer(lang: str) -> MosesPunctNormalizer:
    return MosesPunctNormalizer(lang=lang, perl_parity=True)


def lc_norm_tok(lines: Iterable[str], lang: str) -> list[str]:
    """``lowercase.perl | normalize-punctuation.perl -l lang | tokenizer.perl -l lang`` on each line
    (upstream's task1-tokenize.sh): what a hypothesis becomes before it is scored."""
    normalizer = _normalizer(lang)
    # The newline: Perl's <STDIN> keeps it, and one normalization rule needs it (module docstring);
    # sacremoses strips the line it returns.
    normalized = [normalizer.normalize(line.lower() + "\n") for line in lines]
    return moses_tokenize(normalized, lang)


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
