"""pipeline/config/overrides.py: section.key=value overrides, read as dvc exp run -S reads them."""

from __future__ import annotations

import pytest
import yaml

from pipeline.config.errors import ParamsError
from pipeline.config.overrides import hydra_value, parse_overrides, set_param, with_overrides
from pipeline.config.params import check
from tests.pipeline.conftest import REPO

pytestmark = pytest.mark.fast


def test_overrides_are_read_as_yaml_and_applied_key_by_key():
    raw = {"train": {"max_steps": 10, "seed": 1}, "model": {"preset": "tiny"}}
    assert parse_overrides(["train.max_steps=7", "data.test_sets=[a, b]", "tracking.experiment="]) == {
        "train.max_steps": 7, "data.test_sets": ["a", "b"], "tracking.experiment": ""}
    merged = with_overrides(raw, ["train.max_steps=7", "model.d_model=64", "flows.gate_set=val"])
    assert merged == {"train": {"max_steps": 7, "seed": 1}, "model": {"preset": "tiny", "d_model": 64},
                      "flows": {"gate_set": "val"}}
    assert raw["train"]["max_steps"] == 10   # a copy
    assert with_overrides(raw, {"train.seed": 3})["train"] == {"max_steps": 10, "seed": 3}
    for bad in ("max_steps=5", "train.max_steps", ".x=1"):
        with pytest.raises(ParamsError, match="is not section.key=value"):
            parse_overrides([bad])
    with pytest.raises(ParamsError, match="the value is not valid YAML"):
        parse_overrides(["data.test_sets=[a"])


def test_check_validates_every_section_with_the_overrides(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text((REPO / "params.yaml").read_text())
    assert check(path, ["train.max_steps=7"]).train.max_steps == 7
    assert check(path, {"tune.alphas": [1, 2]}).tune.alphas == [1.0, 2.0]
    with pytest.raises(ParamsError, match=r"^params.yaml: tune.alphas\[1\] must be a number >= 0, got -2.0$"):
        check(path, {"tune.alphas": [1, -2]})
    with pytest.raises(ParamsError, match="^params.yaml: unknown section trian"):
        check(path, ["trian.max_steps=5"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]   # nothing written


def test_values_are_written_in_hydras_grammar():
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    assert set_param("train.lr_scale", [0.4, 0.6], raw) == "train.lr_scale=0.4,0.6"   # a sweep of two
    assert set_param("model.d_model", [64], raw) == "+model.d_model=64"               # a key params.yaml lacks
    assert set_param("data.test_sets", [["a", "b"]], raw) == "data.test_sets=[a,b]"   # one list, no sweep
    assert hydra_value(None) == "null" and hydra_value("") == "''" and hydra_value("0 3 * * 1") == "'0 3 * * 1'"
    assert hydra_value("a,b") == "'a,b'" and hydra_value("true") == "'true'" and hydra_value(False) == "false"
