"""sacreBLEU's corpus scores of detokenized translations: BLEU (Papineni et al., 2002; the measure of
§6.1, here with sacreBLEU's standard 13a tokenization, cased) and chrF, with their signatures.

Both the tune stage (the validation grid) and the evaluate stage (test sets and the validation set)
score with this one function, so a tuned choice and a reported score are the same measure.
"""

from __future__ import annotations

from typing import Any

import sacrebleu


def score(hypotheses: list[str], references: list[str]) -> dict[str, Any]:
    """Corpus BLEU and chrF of detokenized text, sacrebleu's defaults (13a tokenization, cased),
    and the hypothesis/reference length ratio (below 1: the brevity penalty bites)."""
    bleu, chrf = sacrebleu.BLEU(), sacrebleu.CHRF()
    b = bleu.corpus_score(hypotheses, [references])
    c = chrf.corpus_score(hypotheses, [references])
    return {"bleu": round(b.score, 2), "chrf": round(c.score, 2),
            "length_ratio": round(b.sys_len / b.ref_len, 3) if b.ref_len else 0.0,
            "signature": str(bleu.get_signature()), "chrf_signature": str(chrf.get_signature())}
