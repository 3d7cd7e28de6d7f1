"""pipeline/tracking/model_card.py: the card's scores table and tags, the literature's BLEU (Multi30k)
in a column of its own beside sacreBLEU's, absent where a data set has none (WMT14)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pipeline.scoring.reports import LITERATURE_LABEL
from pipeline.tracking.model_card import model_card

pytestmark = pytest.mark.fast

SIGNATURE = "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0"
DECODING = {"beam_size": 4, "alpha": 1.75, "stopping": "fairseq", "max_len_b": 50, "precision": "bf16"}
CONFIG = {"d_model": 256, "n_encoder_layers": 3, "n_decoder_layers": 3, "n_heads": 4, "max_positions": 256}


def fake_run(dataset: str = "multi30k") -> SimpleNamespace:
    return SimpleNamespace(data=SimpleNamespace(params={"model.preset": "laptop"},
                                                tags={"dataset": dataset, "language_pair": "en-de"}, metrics={}),
                           info=SimpleNamespace(run_id="0123abcd", run_name="laptop-run"))


def test_the_literatures_bleu_has_its_own_column_and_tag():
    metrics = {"test": {"test_2016_flickr": {"bleu": 37.99, "chrf": 62.48, "sentences": 1000, "signature": SIGNATURE,
                                             "bleu_lc_tok": 38.4, "bleu_lc_tok_description": "..."}},
               "dev": {"val": {"bleu": 39.37, "chrf": 64.1, "bleu_lc_tok": 40.12}}}
    card, tags = model_card("transformer-en-de", "3", fake_run(), metrics=metrics, decoding=DECODING,
                            model_config=CONFIG)
    assert "| test set | BLEU | chrF | sentences | BLEU lc.tok (the literature's) |" in card
    assert "| test_2016_flickr | 37.99 | 62.48 | 1000 | 38.40 |" in card
    assert f"- BLEU lc.tok: {LITERATURE_LABEL}" in card and "not comparable with sacreBLEU's" in card
    assert "BLEU 39.37 (BLEU lc.tok 40.12, reported only)" in card
    assert tags["bleu.test_2016_flickr"] == "37.99" and tags["bleu_lc_tok.test_2016_flickr"] == "38.40"


def test_a_model_of_the_literatures_text_form_has_that_bleu_alone():
    """Its BLEU is BLEU lc.tok of its output as written (pipeline.scoring.measure): no second column, no
    sacreBLEU signature, and the casing limit says it reads and writes lowercase."""
    written = "lowercased, Moses-tokenized, vs upstream lc.norm.tok references: as the model writes them"
    metrics = {"test": {"test_2016_flickr": {"bleu": 41.3, "chrf": 66.0, "sentences": 1000, "signature": written,
                                             "bleu_lc_tok": 41.3, "measure": "bleu_lc_tok"}},
               "dev": {"val": {"bleu": 42.5, "chrf": 67.0, "bleu_lc_tok": 42.5, "measure": "bleu_lc_tok"}}}
    card, tags = model_card("transformer-en-de", "5", fake_run(), metrics=metrics, decoding=DECODING,
                            model_config=CONFIG)
    assert "| test set | BLEU | chrF | sentences |\n|---|---:|---:|---:|\n| test_2016_flickr | 41.30 |" in card
    assert f"- test_2016_flickr: BLEU lc.tok `{written}`" in card and "sacreBLEU `" not in card
    assert "this model writes lowercased, Moses-tokenized text" in card and "reported only" not in card
    assert "answers in lowercase, detokenized" in card and "never lowercased" not in card
    assert tags["bleu_lc_tok.signature.test_2016_flickr"] == written and "sacrebleu.test_2016_flickr" not in tags


def test_the_confidence_intervals_stand_beside_their_scores():
    """Both BLEUs with the half-widths of their 95% bootstrap intervals, and a line saying what ± is;
    the card without them (the test above, a version registered before) has no such line."""
    metrics = {"test": {"test_2016_flickr": {"bleu": 38.19, "bleu_ci95": 1.63, "chrf": 62.63, "sentences": 1000,
                                             "signature": SIGNATURE, "bleu_lc_tok": 38.62, "bleu_lc_tok_ci95": 1.71,
                                             "bleu_lc_tok_description": "..."}}}
    card, tags = model_card("transformer-en-de", "4", fake_run(), metrics=metrics, decoding=DECODING,
                            model_config=CONFIG)
    assert "| test_2016_flickr | 38.19 ± 1.63 | 62.63 | 1000 | 38.62 ± 1.71 |" in card
    assert "- ±: half-width of the 95% confidence interval from sacreBLEU's bootstrap" in card
    assert tags["bleu.test_2016_flickr"] == "38.19"
    old, _ = model_card("transformer-en-de", "3", fake_run(), metrics={"test": {"test_2016_flickr": {
        "bleu": 37.99, "chrf": 62.48, "sentences": 1000, "signature": SIGNATURE}}}, decoding=DECODING,
        model_config=CONFIG)
    assert "±" not in old


def test_no_column_where_the_data_set_has_no_literature_measure():
    metrics = {"test": {"newstest2014": {"bleu": 27.1, "chrf": 57.0, "sentences": 3003, "signature": SIGNATURE,
                                         "bleu_tok_compound_split": 27.9}},
               "dev": {"newstest2013": {"bleu": 26.0, "chrf": 55.0}}}
    card, tags = model_card("transformer-en-de", "1", fake_run("wmt14_en_de"), metrics=metrics, decoding=DECODING,
                            model_config=CONFIG)
    assert ("| test set | BLEU | chrF | sentences |\n|---|---:|---:|---:|\n"
            "| newstest2014 | 27.10 | 57.00 | 3003 |") in card
    assert "lc.tok" not in card and not any(k.startswith("bleu_lc_tok") for k in tags)


def test_the_card_names_the_engine_and_its_compute_type():
    metrics = {"test": {"test_2016_flickr": {"bleu": 38.03, "chrf": 62.5, "sentences": 1000, "signature": SIGNATURE}}}
    ct2 = {**DECODING, "engine": "ctranslate2", "compute_type": "int8", "engine_from": "tune"}
    card, tags = model_card("transformer-en-de", "4", fake_run(), metrics=metrics, decoding=ct2, model_config=CONFIG)
    assert "pieces, CTranslate2 (int8; tuned on the validation set (reports/tune.json))." in card
    assert (tags["decoding.engine"], tags["decoding.compute_type"]) == ("ctranslate2", "int8")
    # a version registered before the engine was a setting: our search, at its precision
    card, _ = model_card("transformer-en-de", "1", fake_run(), metrics=metrics, decoding=DECODING, model_config=CONFIG)
    assert "pieces, our PyTorch search (bf16; registered before the engine was a setting)." in card
