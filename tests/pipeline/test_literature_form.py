"""``tokenizer.text_form: lc_norm_tok`` through the whole pipeline (``dvc repro`` of the tiny params on
300 real Multi30k pairs): the training text in the literature's form (lowercased, normalized,
Moses-tokenized, both sides), the form stored in the checkpoints and the averaged model, tune choosing
and evaluate scoring by ``bleu_lc_tok`` of the hypotheses as written (never tokenized twice), and a
loaded model preparing its input and giving readers detokenized text (the pyfunc model and the server
load it the same way)."""

from __future__ import annotations

import json

import pytest

from pipeline.config.decoding import DecodingConfig
from pipeline.data.references import tokenized_references
from pipeline.scoring.literature_bleu import LABEL, lc_norm_tok
from pipeline.scoring.paper_bleu import multi_bleu
from pipeline.serving.engine import load_engine_translator
from pipeline.serving.mlflow_model import TranslatorModel
from pipeline.text.names import CHECKPOINT_KEY, TextForm, text_form_of
from transformer.checkpoint import load_checkpoint
from transformer.tokenizer import Tokenizer
from transformer.training.token_store import TokenStore

from .conftest import TINY, Workspace, make_workspace, needs_mirror, tiny_params

pytestmark = [needs_mirror, pytest.mark.pipeline]

FORM = {"name": "lc_norm_tok", "src_lang": "en", "tgt_lang": "de"}


@pytest.fixture(scope="module")
def literature_run(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    params = tiny_params({"tokenizer": {**TINY["tokenizer"], "text_form": "lc_norm_tok"},
                          "tune": {**TINY["tune"], "stoppings": ["fairseq"]},
                          "tracking": {**TINY["tracking"], "experiment": "literature-form"}})
    path, env = make_workspace(tmp_path_factory.mktemp("literature") / "repo", params)
    ws = Workspace(path, env, None)  # type: ignore[arg-type]
    ws.first_run = ws.dvc("repro", timeout=600)
    assert ws.first_run.returncode == 0, ws.first_run.stdout[-3000:] + ws.first_run.stderr[-3000:]
    return ws


def test_every_split_is_encoded_in_the_literature_form(literature_run):
    root = literature_run.path
    assert json.loads((root / "data/tokens/stats.json").read_text())[CHECKPOINT_KEY] == FORM
    tokenizer = Tokenizer(root / "data/tokenizer/spm.model")
    for split in ("train", "val"):
        store = TokenStore(root / "data/tokens" / split)
        for lang, side in (("en", "src"), ("de", "tgt")):
            raw = (root / f"data/corpus/{split}.{lang}").read_text().splitlines()[:20]
            decoded = tokenizer.decode([store.pair(i)[0 if side == "src" else 1].tolist() for i in range(20)])
            assert decoded == lc_norm_tok(raw, lang)
            assert all(line == line.lower() for line in decoded)
    assert "lc_norm_tok" in literature_run.first_run.stdout


def test_the_checkpoints_and_the_averaged_model_name_the_form(literature_run):
    root = literature_run.path
    checkpoints = sorted((root / "models/checkpoints").glob("*.pt"))
    assert checkpoints
    for path in checkpoints:   # the train stage's callback's entry
        assert load_checkpoint(path)["callbacks"][CHECKPOINT_KEY] == FORM, path
        assert text_form_of(load_checkpoint(path)) == TextForm(**FORM)
    assert load_checkpoint(root / "models/model.pt")[CHECKPOINT_KEY] == FORM


def test_tune_chooses_by_bleu_lc_tok_of_the_hypotheses_as_written(literature_run):
    root = literature_run.path
    report = json.loads((root / "reports/tune/scores.json").read_text())
    assert report["measure"] == "bleu_lc_tok"
    assert report["signature"].startswith(LABEL) and "not tokenized again" in report["signature"]
    written = (root / "reports/tune/val.de").read_text().splitlines()
    references = tokenized_references("val", root / "data/references")[0][:len(written)]
    as_written = round(multi_bleu(written, references).score, 2)
    assert report["chosen"]["bleu"] == report["chosen"]["bleu_lc_tok"] == as_written
    assert json.loads((root / "reports/tune.json").read_text())["valid_bleu"] == as_written
    best = max(point["bleu"] for point in report["grid"])
    assert report["chosen"]["bleu"] == best


def test_evaluate_reports_bleu_lc_tok_alone(literature_run):
    root = literature_run.path
    detail = json.loads((root / "reports/evaluate/scores.json").read_text())
    m = detail["test"]["test_2016_flickr"]
    written = (root / "reports/translations/test_2016_flickr.de").read_text().splitlines()
    references, _ = tokenized_references("test_2016_flickr", root / "data/references")
    assert m["measure"] == "bleu_lc_tok"
    assert m["bleu"] == m["bleu_lc_tok"] == round(multi_bleu(written, references).score, 2)
    assert m["bleu_ci95"] == m["bleu_lc_tok_ci95"] >= 0
    assert not m["signature"].startswith("nrefs:")   # no sacreBLEU signature: no cased score
    assert "case:lc" in m["chrf_signature"]
    assert all(line == line.lower() for line in written)
    assert not any("&amp;" in line for line in written)   # never escaped twice
    dev = detail["dev"]["val"]
    assert dev["bleu"] == dev["bleu_lc_tok"] and dev["measure"] == "bleu_lc_tok"


def test_a_loaded_model_prepares_its_input_and_detokenizes_for_readers(literature_run):
    root = literature_run.path
    translator = load_engine_translator(root / "models/model.pt", root / "data/tokenizer/spm.model",
                                        DecodingConfig(beam_size=2, max_len_b=8))
    tokenizer = translator.tokenizer
    text = "A Man's HAT, \u201cblue\u201d."
    assert tokenizer.prepare([text]) == lc_norm_tok([text], "en")
    assert tokenizer.for_reader(["ein mann &apos;s hut , &quot; blau &quot; ."]) == ['ein mann \'s hut, "blau".']
    # The pyfunc model (and the server, which checks requests with it) reads and writes alike.
    model = TranslatorModel()
    model.translator = translator
    ids = model.check(["Two dogs run in the SNOW."])
    assert ids == tokenizer.encode(["Two dogs run in the SNOW."])
    assert ids == [tokenizer.sp.encode("two dogs run in the snow .", out_type=int)]
    served = model.predict(None, ["Two dogs run in the SNOW."])
    written = tokenizer.decode(translator.translate_ids(ids, beam_size=2))
    assert served == tokenizer.for_reader(written)


def test_ctranslate2_the_server_and_the_translate_command_read_and_write_alike(literature_run, monkeypatch,
                                                                             capsys):
    from pipeline.serving import translate
    from pipeline.serving.ct2_translator import CT2Translator
    from pipeline.serving.server.requests import Pieces, checked

    root = literature_run.path
    ct2 = load_engine_translator(root / "models/model.pt", root / "data/tokenizer/spm.model",
                                 DecodingConfig(beam_size=2, max_len_b=8, engine="ctranslate2", compute_type="int8",
                                                stopping="fairseq"),
                                 ct2_model=root / "models/ctranslate2")
    assert isinstance(ct2, CT2Translator)
    assert ct2.tokenizer.prepare(["A MAN'S HAT."]) == ["a man &apos;s hat ."]
    # The server: a request's sentences prepared, a batch's hypotheses detokenized for the reader.
    ids, _ = checked(ct2, {"inputs": ["A MAN'S HAT."]})
    assert ids == [ct2.tokenizer.sp.encode("a man &apos;s hat .", out_type=int)]
    written = ct2.tokenizer.sp.encode("ein mann &apos;s hut , &quot; blau &quot; .", out_type=int)
    assert Pieces(ct2.tokenizer).decode([written]) == ['ein mann \'s hut, "blau".']
    # The translate command answers readers (the model's output stood in for: the tiny model writes little).
    monkeypatch.chdir(root)
    seen = []
    monkeypatch.setattr(CT2Translator, "translate",
                        lambda self, sentences, *a, **k: seen.extend(self.tokenizer.prepare(sentences))
                        or ["ein mann &apos;s hut ."] * len(sentences))
    source = root / "source.en"
    source.write_text("A MAN'S HAT.\n\nTwo dogs.\n")
    translate.main(["--input", str(source), "--engine", "ctranslate2"])
    assert capsys.readouterr().out == "ein mann 's hut.\n\nein mann 's hut.\n"
    assert seen == ["a man &apos;s hat .", "two dogs ."]

