"""Scoring translations: BLEU as the paper measured it (``paper_bleu``: tokenized, compound-split)
beside sacreBLEU."""
