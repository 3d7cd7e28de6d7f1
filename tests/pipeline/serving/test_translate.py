"""pipeline/serving/translate.py: the command line translates stdin or a file with the pipeline's
model, keeps empty lines, takes its decoding defaults from params.yaml and the tune report (the
paper's with a warning before tune has run; a corrupt report is an error), decodes with the tuned
engine (``--engine``: another one, with its own tuned settings) and fails in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from pipeline.config.decoding import DecodingConfig
from pipeline.serving.ct2_translator import load_ct2_translator
from pipeline.serving.export import export_ctranslate2
from pipeline.serving.translator import Translator, load_translator
from transformer.checkpoint import load_model, model_checkpoint, save_checkpoint
from transformer.config import build_config
from transformer.model import Transformer
from transformer.tokenizer import Tokenizer, train_tokenizer

from ...fakes import params_with
from ..conftest import REPO

pytestmark = pytest.mark.fast

SOURCES = ["A man is riding a bike.", "", "Two dogs play in the snow."]


def tuned(workspace):
    """The decoding settings evaluate used: params.yaml's evaluate section, tune's choice for nulls."""
    from pipeline.config.params import load_params
    from pipeline.serving.decoding import decoding_settings

    return decoding_settings(load_params(workspace.path / "params.yaml").evaluate,
                             workspace.path / "reports/tune.json")


def test_translates_stdin_like_the_translator(workspace):
    done = subprocess.run([sys.executable, "-m", "pipeline.serving.translate"], cwd=workspace.path, env=workspace.env,
                          input="\n".join(SOURCES) + "\n", capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 3 and lines[1] == ""                          # empty lines kept in place
    chosen = tuned(workspace)
    evaluate = yaml.safe_load((workspace.path / "params.yaml").read_text())["evaluate"]
    translator = Translator(load_model(workspace.path / "models/model.pt"),
                            Tokenizer(workspace.path / "data/tokenizer/spm.model"),
                            DecodingConfig(chosen.beam_size, chosen.alpha, evaluate["max_len_b"]))
    assert [lines[0], lines[2]] == translator.translate([SOURCES[0], SOURCES[2]])


def test_file_output_and_defaults_from_params(workspace, tmp_path):
    source = tmp_path / "in.en"
    source.write_text("\n".join(SOURCES) + "\n")
    out = tmp_path / "out.de"
    done = workspace.run(sys.executable, "-m", "pipeline.serving.translate", "--input", str(source),
                         "--output", str(out), "--beam-size", "1")
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(out.read_text().splitlines()) == 3
    usage = workspace.run(sys.executable, "-m", "pipeline.serving.translate", "--help").stdout
    chosen = tuned(workspace)
    assert chosen.alpha_from == "tune"   # evaluate.alpha is null: the tune stage's choice on val
    assert f"default: {chosen.alpha}, from reports/tune.json (tuned on the validation set)" in " ".join(usage.split())


def test_missing_model_is_one_line(workspace, tmp_path):
    done = workspace.run(sys.executable, "-m", "pipeline.serving.translate", "--model", str(tmp_path / "none.pt"))
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and done.stderr.startswith("error: checkpoint ")
    assert "does not exist (train a model first: make run)" in done.stderr


# ----------------------------------------------------------------------------- before and after tune


@pytest.fixture(scope="module")
def untuned(tmp_path_factory) -> Path:
    """A folder laid out as the repository after training, before the tune stage: params.yaml with
    evaluate's beam size, alpha and stopping rule null (tune decides), a tiny random model and its
    tokenizer, no reports/tune.json."""
    root = tmp_path_factory.mktemp("untuned")
    params = params_with({"evaluate": {"beam_size": None, "alpha": None, "stopping": None, "max_len_b": 6}})
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    texts = [" ".join(SOURCES)] * 20 + ["Ein Mann fährt Fahrrad. Zwei Hunde spielen im Schnee."] * 20
    tokenizer = train_tokenizer(texts, root / "data/tokenizer/spm.model", 48)
    torch.manual_seed(0)
    save_checkpoint(root / "models/model.pt", model_checkpoint(Transformer(build_config("tiny", tokenizer.vocab_size))))
    return root


def translate(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "pipeline.serving.translate", *args], cwd=root, env=env,
                          input="\n".join(SOURCES) + "\n", capture_output=True, text=True, timeout=120)


def as_the_command_translates(translator: Translator) -> list[str]:
    """SOURCES' lines translated as the command does: the non-empty ones together, empty ones kept."""
    translated = iter(translator.translate([s for s in SOURCES if s]))
    return [next(translated) if s else "" for s in SOURCES]


def test_without_a_tune_report_the_papers_settings_with_a_warning(untuned):
    done = translate(untuned)
    assert done.returncode == 0, done.stderr[-2000:]
    (warning,) = done.stderr.splitlines()
    assert warning == ("warning: reports/tune.json does not exist (the tune stage has not run): translating with "
                       "the paper's beam_size 4, alpha 0.6, stopping exact, engine torch (§6.1), not settings "
                       "chosen on the validation set")
    paper = load_translator(untuned / "models/model.pt", untuned / "data/tokenizer/spm.model",
                            DecodingConfig(max_len_b=6), device="cpu")
    assert done.stdout.splitlines() == as_the_command_translates(paper)
    # Settings given on the command line are no fallback: the warning names only what still is.
    done = translate(untuned, "--beam-size", "2", "--alpha", "1.0")
    assert done.returncode == 0 and done.stderr.splitlines() == [warning.replace("beam_size 4, alpha 0.6, ", "")]
    done = translate(untuned, "--beam-size", "2", "--alpha", "1.0", "--stopping", "fairseq", "--engine", "torch")
    assert done.returncode == 0 and done.stderr == ""


@pytest.mark.parametrize("report", [
    "{not json",
    json.dumps({"chosen": {"beam_size": 4, "alpha": 1.5}}),                            # before the rule was tuned
    json.dumps({"chosen": {"beam_size": 0, "alpha": 1.5, "stopping": "exact"}}),
])
def test_a_corrupt_tune_report_is_an_error_never_the_papers_settings(untuned, report):
    (untuned / "reports").mkdir(exist_ok=True)
    (untuned / "reports/tune.json").write_text(report)
    try:
        done = translate(untuned)
    finally:
        (untuned / "reports/tune.json").unlink()
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("error: reports/tune.json holds no valid choice (") and "rerun the tune stage" in line


def test_a_valid_tune_report_sets_the_null_settings(untuned):
    (untuned / "reports").mkdir(exist_ok=True)
    (untuned / "reports/tune.json").write_text(json.dumps({"chosen": {"beam_size": 2, "alpha": 1,
                                                                      "stopping": "fairseq"}}))
    try:
        done = translate(untuned)
        usage = " ".join(translate(untuned, "--help").stdout.split())
    finally:
        (untuned / "reports/tune.json").unlink()
    assert done.returncode == 0 and done.stderr == ""
    tuned_ = load_translator(untuned / "models/model.pt", untuned / "data/tokenizer/spm.model",
                             DecodingConfig(beam_size=2, alpha=1.0, stopping="fairseq", max_len_b=6), device="cpu")
    assert done.stdout.splitlines() == as_the_command_translates(tuned_)
    assert "(default: 1.0, from reports/tune.json (tuned on the validation set))" in usage
    assert "(default: 6, from params.yaml's evaluate section)" in usage


def test_the_tuned_engine_decodes_and_another_takes_its_own_tuned_settings(untuned):
    tokenizer = untuned / "data/tokenizer/spm.model"
    model = load_model(untuned / "models/model.pt")
    exported = export_ctranslate2(model, tokenizer, untuned / "models/ctranslate2")
    points = {"torch": {"beam_size": 2, "alpha": 1.5, "stopping": "exact", "engine": "torch", "compute_type": None},
              "ctranslate2": {"beam_size": 3, "alpha": 1.0, "stopping": "fairseq", "engine": "ctranslate2",
                              "compute_type": "int8"}}
    (untuned / "reports/tune").mkdir(parents=True, exist_ok=True)
    (untuned / "reports/tune.json").write_text(json.dumps({"chosen": points["ctranslate2"], "valid_bleu": 1.0}))
    (untuned / "reports/tune/scores.json").write_text(json.dumps({"engines": {
        name: {"chosen": {**point, "bleu": 1.0}} for name, point in points.items()}}))
    try:
        chosen, by_torch = translate(untuned), translate(untuned, "--engine", "torch")
    finally:
        (untuned / "reports/tune.json").unlink()
        (untuned / "reports/tune/scores.json").unlink()
    ct2 = load_ct2_translator(exported, tokenizer, DecodingConfig(**points["ctranslate2"] | {"max_len_b": 6}),
                              model.config.max_positions)
    assert chosen.returncode == 0 and chosen.stderr == ""
    assert chosen.stdout.splitlines() == as_the_command_translates(ct2)
    ours = load_translator(model_checkpoint(model), tokenizer, DecodingConfig(beam_size=2, alpha=1.5, max_len_b=6),
                           device="cpu")   # torch's own alpha (GNMT's penalty) and stopping rule
    assert by_torch.returncode == 0 and by_torch.stderr == ""
    assert by_torch.stdout.splitlines() == as_the_command_translates(ours)
