"""Where the tune and evaluate stages' reports lie, and the keys of ``reports/metrics.json``.

Each stage writes two kinds of file (the schema: docs/metrics.md):

- its DVC metric (``reports/train_metrics.json``, ``reports/tune.json``, ``reports/metrics.json``):
  a few headline numbers and settings, flat enough that ``dvc metrics show`` reads at a glance;
- its detail, a DVC output beside it (``reports/tune/scores.json``, ``reports/evaluate/scores.json``):
  the same headline and everything else (sacreBLEU's signatures, the whole tune grid, lengths,
  sentence counts, where each decoding setting came from).

A new key goes to the detail unless a reader needs it at a glance. Light (paths and names only),
so that the flows, the model card and the serving code read the reports without loading a stage.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.config import paths

TUNE_DIR = paths.REPORTS_DIR / "tune"        # a DVC output of the tune stage
TUNE_RUN = TUNE_DIR / "run.json"             # what tune decoded (model hash, settings), for evaluate to reuse
TUNE_SCORES = TUNE_DIR / "scores.json"       # the detail of reports/tune.json: the rule, the grid, signature
EVALUATE_DIR = paths.REPORTS_DIR / "evaluate"  # a DVC output of the evaluate stage
EVALUATE_SCORES = EVALUATE_DIR / "scores.json"  # the detail of reports/metrics.json

# reports/metrics.json (and its detail): {TEST: {test set: scores}, DEV: {validation set: scores},
# DECODING: the settings used}. The test sets sit under their own key so that a new top-level key
# is never mistaken for one.
TEST, DEV, DECODING = "test", "dev", "decoding"
# A set's score beside sacreBLEU's where the data set publishes tokenized references (Multi30k): the
# literature's BLEU (pipeline/scoring/literature_bleu.py), reported, never ranking, never compared with sacreBLEU.
LITERATURE_KEY = "bleu_lc_tok"
# What ranks runs (sweeps, ``make compare``): validation BLEU of the averaged model with the decoding
# settings chosen on the validation set, logged by the tune and evaluate stages. Test scores are
# shown, never used to rank.
RANK_METRIC = "valid_bleu"
LITERATURE_LABEL = "lowercased, Moses-tokenized, vs upstream lc.norm.tok references (the literature's)"


def scores_of_test_sets(metrics: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The test sets' scores of ``reports/metrics.json`` or its detail, by test set."""
    return dict(metrics.get(TEST) or {})


def scores_of_dev_sets(metrics: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The validation set's scores (what the promotion gate judges), by set."""
    return dict(metrics.get(DEV) or {})
