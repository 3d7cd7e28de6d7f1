"""sacreBLEU's corpus scores of detokenized translations: BLEU (Papineni et al., 2002; the measure of
§6.1, here with sacreBLEU's standard 13a tokenization, cased) and chrF, with their signatures, and
on request BLEU's 95% confidence interval from sacreBLEU's bootstrap resampling (Koehn, 2004).

Both the tune stage (the validation grid) and the evaluate stage (test sets and the validation set)
score with this one function, so a tuned choice and a reported score are the same measure.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sacrebleu
from sacrebleu.metrics.base import Metric

# sacreBLEU draws its resamples from numpy seeded by $SACREBLEU_SEED (default 12345); the seed is fixed
# here so that a reported interval follows from the translations alone, whatever the environment says.
BOOTSTRAP_SEED = "12345"
BOOTSTRAP_RESAMPLES = 1000


@contextmanager
def _seeded() -> Iterator[None]:
    before = os.environ.get("SACREBLEU_SEED")
    os.environ["SACREBLEU_SEED"] = BOOTSTRAP_SEED
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("SACREBLEU_SEED", None)
        else:
            os.environ["SACREBLEU_SEED"] = before


def bootstrap_ci(metric: Metric, hypotheses: list[str], references: list[str],
                 resamples: int = BOOTSTRAP_RESAMPLES) -> tuple[float, float]:
    """``(mean, half-width)`` of ``metric``'s 95% confidence interval over ``resamples`` bootstrap
    resamples of the sentences (sacreBLEU's own resampling, seeded by ``BOOTSTRAP_SEED``)."""
    with _seeded():
        result = metric.corpus_score(hypotheses, [references], n_bootstrap=resamples)
    return float(result._mean), float(result._ci)


def score(hypotheses: list[str], references: list[str], bootstrap: int = 0) -> dict[str, Any]:
    """Corpus BLEU and chrF of detokenized text, sacrebleu's defaults (13a tokenization, cased),
    and the hypothesis/reference length ratio (below 1: the brevity penalty bites). With
    ``bootstrap`` > 1 also ``bleu_ci95``: the half-width of BLEU's 95% confidence interval over that
    many resamples (the signature then names them and the seed: ``bs:1000|seed:12345``)."""
    bleu, chrf = sacrebleu.BLEU(), sacrebleu.CHRF()
    b = bleu.corpus_score(hypotheses, [references])
    c = chrf.corpus_score(hypotheses, [references])
    scores: dict[str, Any] = {"bleu": round(b.score, 2), "chrf": round(c.score, 2),
                              "length_ratio": round(b.sys_len / b.ref_len, 3) if b.ref_len else 0.0}
    if bootstrap > 1:
        scores["bleu_ci95"] = round(bootstrap_ci(bleu, hypotheses, references, bootstrap)[1], 2)
    scores.update(signature=str(bleu.get_signature()), chrf_signature=str(chrf.get_signature()))
    return scores
