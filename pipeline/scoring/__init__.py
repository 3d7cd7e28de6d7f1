"""Scoring translations: sacreBLEU's BLEU and chrF (``sacrebleu_scores``), BLEU as the paper measured
it (``paper_bleu``: tokenized, compound-split) beside it, and where the stages' score reports lie and
what their metric files hold (``reports``; docs/metrics.md)."""
