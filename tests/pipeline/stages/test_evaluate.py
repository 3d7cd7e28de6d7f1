"""pipeline/stages/evaluate.py: sacrebleu scores with signatures, translations, attention heatmaps,
the decoding settings used and where they came from, the validation translations the gate judges, and
the literature's BLEU beside sacreBLEU's."""

import json

import matplotlib.image as mpimg
import sacrebleu
from mlflow.tracking import MlflowClient

from pipeline.scoring.literature_bleu import LABEL, bleu_lc_tok


def test_metrics_match_sacrebleu_on_the_written_translations(workspace):
    detail = json.loads((workspace.path / "reports/evaluate/scores.json").read_text())
    assert list(detail["test"]) == ["test_2016_flickr"]
    m = detail["test"]["test_2016_flickr"]
    hyps = (workspace.path / "reports/translations/test_2016_flickr.de").read_text().splitlines()
    refs = (workspace.path / "data/corpus/test_2016_flickr.de").read_text().splitlines()
    assert len(hyps) == len(refs) == m["sentences"] == 1000
    assert m["bleu"] == round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2)
    assert m["chrf"] == round(sacrebleu.corpus_chrf(hyps, [refs]).score, 2)
    assert m["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert "chrf_signature" in m


def test_the_metric_file_is_the_details_headline(workspace):
    """reports/metrics.json (what `dvc metrics show` prints) holds per set BLEU and chrF (and, Multi30k,
    the literature's BLEU) and the decoding settings used, each equal to its detail in
    reports/evaluate/scores.json; nothing else."""
    metrics = json.loads((workspace.path / "reports/metrics.json").read_text())
    detail = json.loads((workspace.path / "reports/evaluate/scores.json").read_text())
    assert set(metrics) == set(detail) == {"test", "dev", "decoding"}
    for group in ("test", "dev"):
        assert metrics[group] == {name: {k: m[k] for k in ("bleu", "chrf", "bleu_lc_tok")}
                                  for name, m in detail[group].items()}
    assert metrics["decoding"] == {k: detail["decoding"][k] for k in ("beam_size", "alpha", "stopping")}


def test_attention_heatmaps_for_every_kind_and_layer(workspace):
    pngs = sorted((workspace.path / "reports/attention").glob("*.png"))
    # 1 sentence (evaluate.attention_sentences) x (encoder self, decoder self, cross) x 2 layers of the tiny preset
    assert len(pngs) == 6
    assert {p.name.split("_", 1)[1] for p in pngs} == {
        f"{kind}_layer{i}.png" for kind in ("encoder", "decoder_self", "cross") for i in (1, 2)}
    image = mpimg.imread(pngs[0])
    assert image.ndim == 3 and image.shape[0] > 50 and image.shape[1] > 50


def first_run_detail(workspace) -> dict:
    """reports/evaluate/scores.json of the session's first `dvc repro` (later experiments change it)."""
    return json.loads(workspace.first_outputs["reports/evaluate/scores.json"])


def test_decoding_settings_and_their_sources_are_recorded(workspace):
    """The tiny params set evaluate.beam_size (2) and leave evaluate.alpha and evaluate.stopping null:
    beam from params, alpha and stopping rule from the tune stage's choice on the validation set."""
    metrics = first_run_detail(workspace)
    tuned = json.loads(workspace.first_outputs["reports/tune.json"])["chosen"]
    assert metrics["decoding"] == {"beam_size": 2, "beam_size_from": "params", "alpha": tuned["alpha"],
                                   "alpha_from": "tune", "stopping": tuned["stopping"], "stopping_from": "tune",
                                   "max_len_b": 8, "precision": "fp32"}


def test_validation_translations_for_the_gate(workspace):
    """The validation set, translated with the settings used on the test sets (here not tune's beam 4,
    so decoded by evaluate), is scored under "dev", never among the test sets."""
    metrics = json.loads((workspace.path / "reports/evaluate/scores.json").read_text())
    dev = metrics["dev"]["val"]
    hyps = (workspace.path / "reports/translations/val.de").read_text().splitlines()
    refs = (workspace.path / "data/corpus/val.de").read_text().splitlines()
    assert dev["sentences"] == len(hyps) == len(refs) == 1014 and dev["translated_by"] == "evaluate"
    assert dev["bleu"] == round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2)
    assert set(metrics) == {"test", "dev", "decoding"} and list(metrics["test"]) == ["test_2016_flickr"]


def test_the_literatures_bleu_beside_sacrebleu(workspace):
    """Multi30k: each set's bleu_lc_tok is the translations lowercased and Moses-tokenized against
    upstream's lc.norm.tok references (the references stage's data/references/), labelled, in the
    headline, the detail and MLflow; reported, never ranking (valid_bleu stays sacreBLEU's)."""
    manifest = json.loads((workspace.path / "data/references/manifest.json").read_text())
    assert list(manifest["sets"]) == ["val", "test_2016_flickr"]
    detail = json.loads((workspace.path / "reports/evaluate/scores.json").read_text())
    metrics = json.loads((workspace.path / "reports/metrics.json").read_text())
    logged = [r.data.metrics for r in MlflowClient(workspace.tracking_uri).search_runs(
        [e.experiment_id for e in MlflowClient(workspace.tracking_uri).search_experiments()])]
    for group, split in (("test", "test_2016_flickr"), ("dev", "val")):
        hyps = (workspace.path / f"reports/translations/{split}.de").read_text().splitlines()
        refs = (workspace.path / f"data/references/{split}.de").read_text().splitlines()
        expected = bleu_lc_tok(hyps, refs, "de", manifest["sets"][split]["url"])
        scores = detail[group][split]
        assert scores["bleu_lc_tok"] == metrics[group][split]["bleu_lc_tok"] == round(expected.score, 2)
        assert scores["bleu_lc_tok_description"] == expected.description
        assert scores["bleu_lc_tok_description"].startswith(LABEL) and "lc.norm.tok.de" in expected.description
        assert "bleu_lc_tok_description" not in metrics[group][split]
        assert any(m.get(f"{group}/{split}/bleu_lc_tok") == scores["bleu_lc_tok"] for m in logged)
    assert "bleu_tok_compound_split" not in detail["test"]["test_2016_flickr"]   # WMT's paper measure only
