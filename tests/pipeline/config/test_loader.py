"""pipeline/config/loader.py: params.yaml read once, just the sections asked for validated."""

from __future__ import annotations

import pytest
import yaml

from pipeline.config import params as params_module
from pipeline.config.data import DataParams
from pipeline.config.errors import ParamsError
from pipeline.config.loader import SECTION_NAMES, load_sections, read_params
from pipeline.config.tokenizer import TokenizerParams
from tests.pipeline.conftest import REPO

pytestmark = pytest.mark.fast


def write(tmp_path, edit):
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    edit(raw)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_only_the_sections_asked_for_are_validated(tmp_path):
    path = write(tmp_path, lambda p: p["train"].update(max_tokens=-5))   # not the tokenizer's business
    loaded = load_sections(DataParams, TokenizerParams, path=path)
    assert loaded.data.pair == "en-de" and loaded.tokenizer.vocab_size == 8000
    assert loaded.flat()["train.max_tokens"] == -5   # tracking sees the whole file, as written
    with pytest.raises(AttributeError, match="section train was not loaded"):
        loaded.train   # noqa: B018


def test_the_file_itself_is_always_checked(tmp_path):
    path = write(tmp_path, lambda p: p.update(trian={}))
    with pytest.raises(ParamsError, match="^params.yaml: unknown section trian"):
        load_sections(DataParams, path=path)
    path = write(tmp_path, lambda p: p.update(data=5))
    with pytest.raises(ParamsError, match="^params.yaml: section data must be a mapping, got 5$"):
        load_sections(DataParams, path=path)
    path.write_text("data:\n  dataset: [unclosed\n")
    with pytest.raises(ParamsError, match=r"^params.yaml is not valid YAML \(line 3, column 1\)"):
        read_params(path)
    path.write_text("- a list\n")
    with pytest.raises(ParamsError, match="must be a mapping of sections"):
        read_params(path)
    with pytest.raises(ParamsError, match="params file .*missing.yaml does not exist"):
        read_params(tmp_path / "missing.yaml")


def test_a_missing_or_null_section_takes_every_default(tmp_path):
    path = write(tmp_path, lambda p: (p.pop("tokenizer"), p.update(data=None)))
    loaded = load_sections(DataParams, TokenizerParams, path=path)
    assert loaded.data == DataParams() and loaded.tokenizer == TokenizerParams()


def test_a_non_string_key_is_unknown(tmp_path):
    path = write(tmp_path, lambda p: p["tokenizer"].update({1: "x"}))
    with pytest.raises(ParamsError, match="^params.yaml: unknown key tokenizer.1 "):
        load_sections(TokenizerParams, path=path)


def test_every_section_has_one_model_named_as_in_the_loader():
    assert tuple(s.SECTION for s in params_module.SECTIONS) == SECTION_NAMES


def test_stages_load_only_their_sections_code():
    """Editing the model's or the training's configuration code reruns training, never the
    download or the tokenizer: their stages do not import it (DVC deps: tests/test_dependencies.py)."""
    from tests.test_dependencies import expected_deps

    deps = expected_deps()
    for stage in ("download", "tokenizer"):
        for light_only in ("pipeline/config/model.py", "pipeline/config/train.py", "pipeline/config/params.py",
                           "transformer/config.py", "transformer/training/train_config.py"):
            assert light_only not in deps[stage], (stage, light_only)
    assert "pipeline/config/train.py" in deps["train"] and "pipeline/config/params.py" not in deps["train"]
    assert "pipeline/config/decoding.py" in deps["evaluate"]
