"""pipeline/serving/translate.py: the command line translates stdin or a file with the pipeline's
model, keeps empty lines, takes its decoding defaults from params.yaml and fails in one line."""

from __future__ import annotations

import subprocess
import sys

import yaml

from pipeline.serving.decoding import DecodingConfig
from pipeline.serving.translator import Translator
from transformer.checkpoint import load_model
from transformer.tokenizer import Tokenizer

SOURCES = ["A man is riding a bike.", "", "Two dogs play in the snow."]


def tuned(workspace):
    """The decoding settings evaluate used: params.yaml's evaluate section, tune's choice for nulls."""
    from pipeline.config.params import decoding_settings, load_params

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
