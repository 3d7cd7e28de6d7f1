"""pipeline/stages/evaluate.py: sacrebleu scores with signatures, translations, attention heatmaps."""

import json

import matplotlib.image as mpimg
import sacrebleu


def test_metrics_match_sacrebleu_on_the_written_translations(workspace):
    metrics = json.loads((workspace.path / "reports/metrics.json").read_text())
    assert list(metrics) == ["test_2016_flickr"]
    m = metrics["test_2016_flickr"]
    hyps = (workspace.path / "reports/translations/test_2016_flickr.de").read_text().splitlines()
    refs = (workspace.path / "data/corpus/test_2016_flickr.de").read_text().splitlines()
    assert len(hyps) == len(refs) == m["sentences"] == 1000
    assert m["bleu"] == round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2)
    assert m["chrf"] == round(sacrebleu.corpus_chrf(hyps, [refs]).score, 2)
    assert m["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert "chrf_signature" in m


def test_attention_heatmaps_for_every_kind_and_layer(workspace):
    pngs = sorted((workspace.path / "reports/attention").glob("*.png"))
    # 2 sentences x (encoder self, decoder self, cross) x 2 layers of the tiny preset
    assert len(pngs) == 12
    assert {p.name.split("_", 1)[1] for p in pngs} == {
        f"{kind}_layer{i}.png" for kind in ("encoder", "decoder_self", "cross") for i in (1, 2)}
    image = mpimg.imread(pngs[0])
    assert image.ndim == 3 and image.shape[0] > 50 and image.shape[1] > 50
