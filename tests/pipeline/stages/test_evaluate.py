"""pipeline/stages/evaluate.py: sacrebleu scores with signatures, translations, attention heatmaps,
the decoding settings used and where they came from (the engine and compute type included: the test
sets decoded by the chosen one, torch where CTranslate2 cannot), the validation translations the gate
judges (the tune stage's reused only when decoded alike), and the literature's BLEU beside sacreBLEU's."""

import json
import shutil
from pathlib import Path

import matplotlib.image as mpimg
import pytest
import sacrebleu
from mlflow.tracking import MlflowClient

from pipeline.config.decoding import DecodingConfig
from pipeline.scoring.literature_bleu import LABEL, bleu_lc_tok
from pipeline.serving.ct2_translator import load_ct2_translator
from pipeline.serving.translator import load_translator
from pipeline.stages.evaluate import evaluate
from transformer.atomic import file_sha256
from transformer.checkpoint import load_checkpoint

from .conftest import SENTENCES

pytestmark = pytest.mark.fast


def test_metrics_match_sacrebleu_on_the_written_translations(workspace):
    detail = json.loads((workspace.path / "reports/evaluate/scores.json").read_text())
    assert list(detail["test"]) == ["test_2016_flickr"]
    m = detail["test"]["test_2016_flickr"]
    hyps = (workspace.path / "reports/translations/test_2016_flickr.de").read_text().splitlines()
    refs = (workspace.path / "data/corpus/test_2016_flickr.de").read_text().splitlines()
    assert len(hyps) == len(refs) == m["sentences"] == 1000
    assert m["bleu"] == round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2)
    assert m["chrf"] == round(sacrebleu.corpus_chrf(hyps, [refs]).score, 2)
    assert m["signature"].startswith("nrefs:1|bs:1000|seed:12345|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert "chrf_signature" in m
    # the 95% confidence interval of sacreBLEU's bootstrap over the 1000 test sentences, seeded
    with_bootstrap = sacrebleu.BLEU().corpus_score(hyps, [refs], n_bootstrap=1000)
    assert m["bleu_ci95"] == round(with_bootstrap._ci, 2) >= 0   # 0 for the barely trained model of the suite


def test_the_metric_file_is_the_details_headline(workspace):
    """reports/metrics.json (what `dvc metrics show` prints) holds per set BLEU and chrF (and, Multi30k,
    the literature's BLEU) and the decoding settings used, each equal to its detail in
    reports/evaluate/scores.json; nothing else."""
    metrics = json.loads((workspace.path / "reports/metrics.json").read_text())
    detail = json.loads((workspace.path / "reports/evaluate/scores.json").read_text())
    assert set(metrics) == set(detail) == {"test", "dev", "decoding"}
    for group, keys in (("test", ("bleu", "bleu_ci95", "chrf", "bleu_lc_tok", "bleu_lc_tok_ci95")),
                        ("dev", ("bleu", "chrf", "bleu_lc_tok"))):
        assert metrics[group] == {name: {k: m[k] for k in keys} for name, m in detail[group].items()}
    assert metrics["decoding"] == {k: detail["decoding"][k] for k in ("beam_size", "alpha", "stopping", "engine",
                                                                     "compute_type")}


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
                                   "engine": tuned["engine"], "engine_from": "tune",
                                   "compute_type": tuned["compute_type"], "compute_type_from": "tune",
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


# ----------------------------------------------------------------------------- the engine, on a small workspace

CHOICES = {"torch": {"beam_size": 2, "alpha": 1.5, "stopping": "exact", "engine": "torch", "compute_type": None},
           "ctranslate2": {"beam_size": 2, "alpha": 1.0, "stopping": "fairseq", "engine": "ctranslate2",
                           "compute_type": "int8"}}


def tune_chose(engine: str) -> dict:
    """reports/tune.json choosing ``engine``'s point of ``CHOICES``, each engine's beside it in the detail."""
    Path("reports/tune").mkdir(parents=True, exist_ok=True)
    Path("reports/tune.json").write_text(json.dumps({"chosen": CHOICES[engine], "valid_bleu": 1.0}))
    Path("reports/tune/scores.json").write_text(json.dumps({"engines": {
        name: {"chosen": {**point, "bleu": 1.0}} for name, point in CHOICES.items()}}))
    return CHOICES[engine]


def lines(path: str) -> list[str]:
    return Path(path).read_text().splitlines()


def decoded_by(engine: str, point: dict) -> list[str]:
    """The test set translated by ``engine`` itself with ``point``'s settings (the workspace's max_len_b, batch)."""
    decoding = DecodingConfig.of({**point, "max_len_b": 6, "batch_sentences": 8})
    if engine == "torch":
        translator = load_translator("models/model.pt", "data/tokenizer/spm.model", decoding, device="cpu")
    else:
        positions = load_checkpoint("models/model.pt")["model_config"]["max_positions"]
        translator = load_ct2_translator("models/ctranslate2", "data/tokenizer/spm.model", decoding, positions)
    return translator.translate(lines("data/corpus/test_2016_flickr.en"))


def test_the_test_sets_are_decoded_by_the_chosen_engine(decoding_workspace, capsys):
    chosen = tune_chose("ctranslate2")
    evaluate(decoding_workspace())
    metrics, detail = json.loads(Path("reports/metrics.json").read_text()), json.loads(
        Path("reports/evaluate/scores.json").read_text())
    assert metrics["decoding"] == chosen   # the engine and compute type named where dvc metrics show reads
    assert {detail["decoding"][f"{k}_from"] for k in chosen} == {"tune"}
    assert lines("reports/translations/test_2016_flickr.de") == decoded_by("ctranslate2", chosen)
    assert "decoding: beam 2 (tune), alpha 1 (tune), stopping fairseq (tune), engine ctranslate2 int8 (tune)" in (
        capsys.readouterr().out)
    # our model's attention over CTranslate2's translation of the first test sentence
    assert len(list(Path("reports/attention").glob("sentence1_*.png"))) == 6


def test_another_engine_set_in_params_takes_its_own_tuned_settings(decoding_workspace):
    tune_chose("ctranslate2")
    evaluate(decoding_workspace(evaluate={"engine": "torch", "attention_sentences": 0}))
    metrics = json.loads(Path("reports/metrics.json").read_text())
    assert metrics["decoding"] == CHOICES["torch"]   # torch's own alpha (GNMT's penalty), no compute type
    assert lines("reports/translations/test_2016_flickr.de") == decoded_by("torch", CHOICES["torch"])


def test_torch_decodes_where_ctranslate2_cannot_and_the_metrics_say_so(decoding_workspace, capsys):
    tune_chose("ctranslate2")
    shutil.rmtree("models/ctranslate2")
    evaluate(decoding_workspace(evaluate={"attention_sentences": 0}))
    warned = [line for line in capsys.readouterr().err.splitlines() if "ctranslate2" in line]
    assert len(warned) == 1 and warned[0].startswith("warning: decoding with torch instead of ctranslate2"), warned
    detail = json.loads(Path("reports/evaluate/scores.json").read_text())["decoding"]
    assert (detail["engine"], detail["compute_type"], detail["engine_from"]) == ("torch", None, "fallback")
    assert lines("reports/translations/test_2016_flickr.de") == decoded_by("torch", CHOICES["ctranslate2"])


def test_tunes_validation_translations_are_reused_only_from_the_same_engine(decoding_workspace):
    chosen = tune_chose("ctranslate2")
    params = decoding_workspace(evaluate={"attention_sentences": 0})
    Path("reports/tune/run.json").write_text(json.dumps({
        "model_sha256": file_sha256(Path("models/model.pt")), "valid_set": "val", "sentences": SENTENCES, **chosen,
        "max_len_b": 6, "batch_sentences": 8, "precision": "fp32"}))
    tuned = [f"tuned {i}" for i in range(SENTENCES)]   # not what either engine writes: reused or not, it shows
    Path("reports/tune/val.de").write_text("".join(f"{line}\n" for line in tuned))
    assert evaluate(params)["dev"]["val"]["translated_by"] == "tune"
    assert lines("reports/translations/val.de") == tuned
    float32 = decoding_workspace(evaluate={"attention_sentences": 0, "compute_type": "float32"})
    assert evaluate(float32)["dev"]["val"]["translated_by"] == "evaluate"   # another compute type: decoded again
    assert lines("reports/translations/val.de") != tuned
