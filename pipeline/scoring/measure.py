"""Which BLEU scores (and so chooses) a model's translations, by the text form it writes
(``pipeline.text.forms``): the tune and evaluate stages ask here, once per split.

- raw text (the default): sacreBLEU, cased and detokenized, against the corpus's own references;
  the literature's ``bleu_lc_tok`` is reported beside it and never chooses.
- the literature's form (``lc_norm_tok``): ``bleu_lc_tok`` alone, the hypotheses as the model writes
  them against upstream's ``lc.norm.tok`` references (``literature_bleu.score_as_written``). It is what
  chooses on the validation set: such a model writes no cased text for sacreBLEU to score.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from pipeline.config.errors import ParamsError
from pipeline.data.references import tokenized_references
from pipeline.scoring.literature_bleu import score_as_written
from pipeline.scoring.reports import LITERATURE_KEY
from pipeline.scoring.sacrebleu_scores import score
from pipeline.text.names import TextForm

Scorer = Callable[..., dict[str, Any]]   # (hypotheses, references, bootstrap=0) -> scores with "bleu"
SACREBLEU = "sacrebleu"


def measure_name(form: TextForm) -> str:
    """What ``bleu`` means in the reports of a model of ``form``."""
    return LITERATURE_KEY if form.literature else SACREBLEU


def scorer_for(form: TextForm, split: str, lang: str, references: list[str]) -> tuple[Scorer, list[str]]:
    """The scoring function of ``split``'s translations into ``lang`` and the references it scores
    against: ``references`` (the corpus's) for raw text; for the literature's form the split's
    ``lc.norm.tok`` references, ``ParamsError`` where the data set publishes none."""
    if not form.literature:
        return score, references
    found = tokenized_references(split)
    if found is None:
        raise ParamsError(f"params.yaml: tokenizer.text_form {form.name} is scored against the data set's "
                          f"lc.norm.tok references, and {split} has none here (the references stage writes "
                          "them where upstream publishes them): use tokenizer.text_form raw for this data set")
    tokenized, url = found
    if len(tokenized) != len(references):
        raise ParamsError(f"{split}: {len(tokenized)} lc.norm.tok references for {len(references)} sentences")
    return functools.partial(score_as_written, lang=lang, references=url), tokenized
