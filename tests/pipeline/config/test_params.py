"""pipeline/config/params.py: params.yaml into typed configs; every bad value is one line naming its key."""

from __future__ import annotations

import pytest
import yaml

from pipeline.config.params import EvaluateParams, ParamsError, load_params
from pipeline.serving.decoding import decoding_settings
from tests.pipeline.conftest import REPO
from transformer.training.trainer import TrainConfig

pytestmark = pytest.mark.fast


def write(tmp_path, edit):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    edit(params)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def test_the_shipped_params_load_into_typed_configs():
    params = load_params(REPO / "params.yaml")
    assert isinstance(params.train, TrainConfig) and params.train.precision == "auto"
    assert params.model.config(8000).d_model == 256 and params.model.config(8000).vocab_size == 8000
    assert params.data.pair == "en-de" and params.data.test_sets == ["test_2016_flickr"]
    flat = params.flat()
    assert flat["train.max_tokens"] == params.train.max_tokens and flat["model.preset"] == "laptop"


def test_the_default_recipe_is_named_and_ends_on_updates():
    """The default model is a preset, with no overrides that another preset would inherit; training
    ends on a number of updates and checkpoints by updates, never on the clock."""
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    assert set(raw["model"]) == {"preset"}
    params = load_params(REPO / "params.yaml")
    assert params.model.overrides == {}
    t = params.train
    assert t.max_minutes == 0 and t.checkpoint_every_minutes == 0
    assert t.max_steps > 0 and t.checkpoint_every_steps > 0
    assert t.max_steps % t.checkpoint_every_steps == 0   # the last checkpoint is the last update's
    assert params.average.last_n <= t.keep_checkpoints


def test_check_refuses_a_bad_value_with_overrides_applied(tmp_path):
    from pipeline.config.params import ParamsError, check

    path = tmp_path / "params.yaml"
    path.write_text((REPO / "params.yaml").read_text())
    assert check(path, ["train.max_steps=7"]).train.max_steps == 7
    with pytest.raises(ParamsError, match="train.max_tokens must be a positive integer, got -5"):
        check(path, ["train.max_tokens=-5"])
    with pytest.raises(ParamsError, match="is not section.key=value"):
        check(path, ["max_tokens=5"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]   # the temporary copy is gone


def test_recipes_load():
    for recipe in sorted((REPO / "params").glob("wmt14_*.yaml")):   # params/sweep.yaml is a sweep, not a recipe
        params = load_params(recipe)
        assert params.data.dataset.startswith("wmt14")
        assert params.model.preset in ("base", "big")


def setter(section, key, value):
    def edit(p):
        p[section][key] = value
    return edit


def deleter(section):
    def edit(p):
        del p[section]
    return edit


BAD = [
    (setter("train", "max_tokens", -5), "params.yaml: train.max_tokens must be a positive integer, got -5"),
    (setter("train", "max_tokens", "many"), "params.yaml: train.max_tokens must be an integer, got 'many'"),
    (setter("train", "update_freq", 0), "params.yaml: train.update_freq must be a positive integer, got 0"),
    (setter("train", "lr_scale", -1.0), "params.yaml: train.lr_scale must be a non-negative number, got -1.0"),
    (setter("train", "cooldown_steps", 99999),
     "params.yaml: train.cooldown_steps (99999) must be at most max_steps ("),
    (setter("train", "label_smoothing", 1.0), "params.yaml: train.label_smoothing must be in [0, 1), got 1.0"),
    (setter("train", "src_word_dropout", 1.0), "params.yaml: train.src_word_dropout must be in [0, 1), got 1.0"),
    (setter("train", "rdrop_alpha", -1.0), "params.yaml: train.rdrop_alpha must be a non-negative number, got -1.0"),
    (setter("train", "precision", "fp8"),
     "params.yaml: train.precision must be one of ('auto', 'fp32', 'bf16', 'fp16'), got 'fp8'"),
    (setter("train", "device", "tpu"), "params.yaml: train.device must be auto, cpu or cuda, got 'tpu'"),
    (setter("train", "nan_policy", "ignore"), "params.yaml: train.nan_policy must be 'skip' or 'stop', got 'ignore'"),
    (setter("train", "max_epochs", True), "params.yaml: train.max_epochs must be an integer, got True"),
    (setter("train", "warmup_stepz", 10), "params.yaml: unknown key train.warmup_stepz"),
    (setter("model", "preset", "huge"), "params.yaml: model.preset 'huge' does not exist"),
    (setter("model", "n_heads", 7), "params.yaml: model.d_model (256) must be divisible by model.n_heads (7)"),
    (setter("model", "dropout", 1.5), "params.yaml: model.dropout must be a number in [0, 1), got 1.5"),
    (setter("model", "activation", "swish"),
     "params.yaml: model.activation must be one of ('relu', 'gelu'), got 'swish'"),
    (setter("model", "positional", "rotary"), "params.yaml: model.positional must be one of"),
    (setter("model", "depth", 3), "params.yaml: unknown key model.depth"),
    (setter("data", "dataset", "nope"), "data.dataset 'nope' is not in the registry"),
    (setter("data", "tgt_lang", "en"), "data.src_lang and data.tgt_lang are both 'en'"),
    (setter("data", "test_sets", []), "data.test_sets must name at least one test set"),
    (setter("data", "test_sets", "test_2016_flickr"), "params.yaml: data.test_sets must be a list"),
    (setter("data", "max_ratio", 0.5), "data.max_ratio must be at least 1, got 0.5"),
    (setter("tokenizer", "vocab_size", 8), "tokenizer.vocab_size must be at least 16, got 8"),
    (setter("tokenizer", "model_type", "wordpiece"), "tokenizer.model_type must be bpe or unigram, got 'wordpiece'"),
    (setter("tokenizer", "text_form", "lowercase"),
     "params.yaml: tokenizer.text_form must be one of raw, lc_norm_tok, got 'lowercase'"),
    (lambda p: (p["tokenizer"].update(text_form="lc_norm_tok"), p["data"].update(test_sets=["test_2018_flickr"])),
     "params.yaml: tokenizer.text_form lc_norm_tok is scored against the data set's lc.norm.tok references, and "
     "multi30k has none for test_2018_flickr in de"),
    (setter("average", "last_n", 0), "average.last_n must be positive, got 0"),
    (setter("evaluate", "beam_size", 0), "evaluate.beam_size must be a positive integer, got 0"),
    (setter("evaluate", "alpha", -0.1), "evaluate.alpha must be a number >= 0, got -0.1"),
    (setter("evaluate", "precision", "int8"), "evaluate.precision must be one of fp32, bf16, got 'int8'"),
    (setter("evaluate", "alpha", "long"), "params.yaml: evaluate.alpha must be a number, got 'long'"),
    (setter("tune", "alphas", []), "params.yaml: tune.alphas must list at least one value"),
    (setter("tune", "alphas", [0.6, -1]), "params.yaml: tune.alphas[1] must be a number >= 0, got -1.0"),
    (setter("tune", "alphas", 0.6), "params.yaml: tune.alphas must be a list, got 0.6"),
    (setter("tune", "beam_sizes", [4, 0]), "params.yaml: tune.beam_sizes[1] must be a positive integer, got 0"),
    (setter("tune", "beam_sizes", [4, 4]), "params.yaml: tune.beam_sizes lists a value twice: [4, 4]"),
    (setter("tune", "beam_sizes", [4.5]), "params.yaml: tune.beam_sizes[0] must be an integer, got 4.5"),
    (setter("tune", "max_sentences", -1), "params.yaml: tune.max_sentences must be >= 0 (0 = all), got -1"),
    (setter("tune", "metric", "chrf"), "params.yaml: unknown key tune.metric"),
    (setter("data", "valid_set", "test_2016_flickr"),
     "params.yaml: data.valid_set 'test_2016_flickr' is also in data.test_sets: the validation set chooses"),
    (setter("flows", "gate_set", "test_2016_flickr"),
     "params.yaml: flows.gate_set 'test_2016_flickr' is a test set (data.test_sets): test sets report, they never "
     "decide"),
    (setter("flows", "gate_set", "test_2017_flickr"),
     "params.yaml: flows.gate_set 'test_2017_flickr' is not data.valid_set ('val')"),
    (setter("flows", "guarded_test_sets", []), "params.yaml: flows.guarded_test_sets was removed: test sets report"),
    (setter("tracking", "experiment", " "), "tracking.experiment must not be empty"),
    (setter("train", "init_from", "models/init/v1/model.pt"),
     "params.yaml: train.init_from models/init/v1/model.pt does not exist in "),
    (setter("train", "init_from", 3), "params.yaml: train.init_from must be a string, got 3"),
    (setter("tokenizer", "model_from", "/nowhere/spm.model"),
     "params.yaml: tokenizer.model_from /nowhere/spm.model does not exist"),
    (setter("train", "init_from", str(REPO / "README.md")),
     f"params.yaml: train.init_from is {REPO / 'README.md'} but tokenizer.model_from is empty: initial weights need "
     "the tokenizer they were trained with"),
    (setter("flows", "retrain_mode", "continue"), "params.yaml: flows.retrain_mode must be one of scratch, finetune, "
                                                  "got 'continue'"),
    (lambda p: p.update(trian={}), "params.yaml: unknown section trian"),
    (lambda p: p["train"].update(max_epochs=0, max_steps=0, max_minutes=0),
     "params.yaml: train.max_steps, train.max_epochs and train.max_minutes are all 0: set a limit"),
]


@pytest.mark.parametrize("edit, message", BAD, ids=[m[:40] for _, m in BAD])
def test_bad_values_name_their_key(tmp_path, edit, message):
    path = write(tmp_path, edit)
    with pytest.raises(ParamsError) as err:
        load_params(path)
    text = str(err.value)
    assert message in text
    assert "\n" not in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]  # nothing written


def test_not_yaml_and_missing_file(tmp_path):
    bad = tmp_path / "params.yaml"
    bad.write_text("train: [unclosed\n")
    with pytest.raises(ParamsError, match="params.yaml is not valid YAML"):
        load_params(bad)
    with pytest.raises(ParamsError, match="does not exist"):
        load_params(tmp_path / "missing.yaml")


def test_init_files_are_relative_to_the_params_file(tmp_path, monkeypatch):
    """Fine-tuning's inputs resolve against the repository root (params.yaml's folder), wherever the
    caller runs (the flows load another workspace's params)."""
    (tmp_path / "models/init/v1").mkdir(parents=True)
    (tmp_path / "models/init/v1/model.pt").write_bytes(b"weights")
    (tmp_path / "models/init/v1/spm.model").write_bytes(b"pieces")

    def edit(p):
        p["train"]["init_from"] = "models/init/v1/model.pt"
        p["tokenizer"]["model_from"] = "models/init/v1/spm.model"
        p["flows"]["retrain_mode"] = "finetune"

    path = write(tmp_path, edit)
    monkeypatch.chdir(REPO)
    params = load_params(path)
    assert params.train.init_from == "models/init/v1/model.pt" and params.flows.retrain_mode == "finetune"
    assert params.tokenizer.model_from == "models/init/v1/spm.model"
    assert params.flat()["train.init_from"] == "models/init/v1/model.pt"


def test_decoding_comes_from_tune_unless_params_set_it(tmp_path):
    """evaluate.beam_size / evaluate.alpha / evaluate.stopping null: the tune stage's choice; a value
    wins, key by key; the source of each is recorded."""
    params = load_params(REPO / "params.yaml")
    # the shipped default: tune decides
    assert (params.evaluate.beam_size, params.evaluate.alpha, params.evaluate.stopping) == (None, None, None)
    assert params.gate_set == params.data.valid_set == "val"
    report = tmp_path / "tune.json"
    report.write_text('{"chosen": {"beam_size": 4, "alpha": 1.5, "stopping": "fairseq", "bleu": 39.1}}')
    d = decoding_settings(EvaluateParams(), report)
    assert (d.beam_size, d.alpha, d.stopping, d.beam_size_from, d.alpha_from, d.stopping_from) == (
        4, 1.5, "fairseq", "tune", "tune", "tune")
    d = decoding_settings(EvaluateParams(beam_size=1, stopping="exact"), report)
    assert (d.beam_size, d.alpha, d.stopping, d.beam_size_from, d.alpha_from, d.stopping_from) == (
        1, 1.5, "exact", "params", "tune", "params")
    d = decoding_settings(EvaluateParams(beam_size=5, alpha=0.6, stopping="exact", engine="torch"),
                          tmp_path / "missing.json")
    assert d.as_dict() == {"beam_size": 5, "alpha": 0.6, "stopping": "exact", "engine": "torch", "compute_type": None,
                           "beam_size_from": "params", "alpha_from": "params", "stopping_from": "params",
                           "engine_from": "params", "compute_type_from": "params"}   # the report is not read
    with pytest.raises(ParamsError, match="missing.json does not exist: evaluate.stopping null means the tune stage"):
        decoding_settings(EvaluateParams(beam_size=5, alpha=0.6, engine="torch"), tmp_path / "missing.json")
    with pytest.raises(ParamsError, match="missing.json does not exist: evaluate.engine null means the tune stage"):
        decoding_settings(EvaluateParams(beam_size=5, alpha=0.6, stopping="exact"), tmp_path / "missing.json")
    report.write_text('{"chosen": {"beam_size": 0, "alpha": 1.5, "stopping": "exact"}}')
    with pytest.raises(ParamsError, match="holds no valid choice"):
        decoding_settings(EvaluateParams(), report)
    report.write_text('{"chosen": {"beam_size": 4, "alpha": 1.5}}')   # a report from before the rule was tuned
    with pytest.raises(ParamsError, match=r"holds no valid choice \(KeyError: 'stopping'\): rerun the tune stage"):
        decoding_settings(EvaluateParams(), report)


def test_a_bad_stopping_rule_names_its_key():
    with pytest.raises(ValueError, match="evaluate.stopping must be one of exact, fairseq, got 'early'"):
        EvaluateParams(stopping="early")


def test_the_engine_and_its_settings_are_checked_together():
    assert EvaluateParams(engine="ctranslate2").stopping is None   # its own rule, or tune's choice
    with pytest.raises(ParamsError, match="^evaluate.engine must be one of torch, ctranslate2, got 'onnx'$"):
        EvaluateParams(engine="onnx")
    with pytest.raises(ParamsError, match="^evaluate.stopping exact is our search's rule, but evaluate.engine is "
                                          "ctranslate2"):
        EvaluateParams(engine="ctranslate2", stopping="exact")
    with pytest.raises(ParamsError, match="^evaluate.compute_type int8 is CTranslate2's, but evaluate.engine is torch"):
        EvaluateParams(engine="torch", compute_type="int8")


def test_explicit_decoding_and_gate_set_load(tmp_path):
    def edit(p):
        p["evaluate"].update(beam_size=5, alpha=1)
        p["flows"]["gate_set"] = "val"
        p["tune"].update(beam_sizes=[1, 4], alphas=[0, 1.5], max_sentences=200)

    params = load_params(write(tmp_path, edit))
    assert (params.evaluate.beam_size, params.evaluate.alpha) == (5, 1.0) and isinstance(params.evaluate.alpha, float)
    assert params.gate_set == "val" and params.tune.alphas == [0.0, 1.5] and params.tune.max_sentences == 200
    assert params.flat()["tune.beam_sizes"] == [1, 4]
