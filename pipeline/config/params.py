"""``params.yaml`` as a whole: every section validated, and the checks that span sections (the gate
set against the data, fine-tuning's input files). ``make run`` and the flows check this before DVC
runs anything; a stage loads only its own sections (``pipeline.config.loader.load_sections``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pipeline.config.average import AverageParams
from pipeline.config.data import DataParams
from pipeline.config.decoding import EvaluateParams, TuneParams
from pipeline.config.errors import ParamsError
from pipeline.config.flows import FlowsParams
from pipeline.config.loader import PARAMS, Sections, load_sections, read_params
from pipeline.config.model import ModelParams, ModelSection
from pipeline.config.overrides import with_overrides
from pipeline.config.tokenizer import TokenizerParams
from pipeline.config.tracking import TrackingParams
from pipeline.config.train import TrainSection, check_init_files
from pipeline.text.names import RAW
from transformer.training.train_config import TrainConfig

# Every section, in params.yaml's order.
SECTIONS = (DataParams, TokenizerParams, ModelSection, TrainSection, AverageParams, TuneParams, EvaluateParams,
            TrackingParams, FlowsParams)


class Params(Sections):
    """Every section of params.yaml (``load_params``)."""

    data: DataParams
    tokenizer: TokenizerParams
    model: ModelParams
    train: TrainConfig
    average: AverageParams
    tune: TuneParams
    evaluate: EvaluateParams
    tracking: TrackingParams
    flows: FlowsParams

    @property
    def gate_set(self) -> str:
        """The development set the promotion gate decides on: ``flows.gate_set`` or ``data.valid_set``."""
        return self.flows.gate_set or self.data.valid_set


def validate(raw: dict[str, Any], root: str | Path = ".") -> Params:
    """Every section of ``raw`` (params.yaml's mapping) and the checks across sections; relative
    file paths are relative to ``root`` (the folder of params.yaml: the repository root)."""
    loaded = load_sections(*SECTIONS, raw=raw)
    params = Params(raw, {name: getattr(loaded, name) for name in (s.SECTION for s in SECTIONS)})
    check_gate_set(params.flows, params.data)
    check_text_form(params.tokenizer, params.data)
    check_init_files(params.train, params.tokenizer, root)
    return params


def load_params(path: str | Path = PARAMS) -> Params:
    """Read and validate every section of ``path``."""
    return validate(read_params(path), Path(path).parent)


def check(path: str | Path = PARAMS, overrides: Mapping[str, Any] | Iterable[str] | None = None) -> Params:
    """Validate every section of ``path`` with ``overrides`` applied (``{"train.max_steps": 7}`` or
    ``["train.max_steps=7"]``, as ``dvc exp run -S`` applies them) before a pipeline starts: DVC
    removes a stage's outputs before the stage runs and has no hook before that, so a bad value must
    be refused here, not by the stage that reads it. Raises ``ParamsError`` naming the key."""
    raw = read_params(path)
    return validate(with_overrides(raw, overrides or {}), Path(path).parent)


def check_gate_set(flows: FlowsParams, data: DataParams) -> None:
    """The gate decides on development data: never a test set, and a set the pipeline translates."""
    gate_set = flows.gate_set
    if not gate_set:
        return
    if gate_set in data.test_sets:
        raise ParamsError(f"params.yaml: flows.gate_set {gate_set!r} is a test set (data.test_sets): test sets "
                          f"report, they never decide; leave it empty for data.valid_set ({data.valid_set!r})")
    if gate_set != data.valid_set:
        raise ParamsError(f"params.yaml: flows.gate_set {gate_set!r} is not data.valid_set ({data.valid_set!r}), "
                          "the development set the pipeline downloads and translates; leave it empty or name it")


def check_text_form(tokenizer: TokenizerParams, data: DataParams) -> None:
    """A model of the literature's text form is tuned and scored against upstream's ``lc.norm.tok``
    references (``pipeline.scoring.measure``): every set it is scored on must have one, refused here
    rather than after training."""
    if tokenizer.text_form == RAW:
        return
    from pipeline.data.references import reference_file

    missing = [s for s in dict.fromkeys([data.valid_set, *data.test_sets])
               if reference_file(data.dataset, s, data.tgt_lang) is None]
    if missing:
        raise ParamsError(f"params.yaml: tokenizer.text_form {tokenizer.text_form} is scored against the data set's "
                          f"lc.norm.tok references, and {data.dataset} has none for {', '.join(missing)} in "
                          f"{data.tgt_lang}: score it on sets that have them, or use tokenizer.text_form {RAW}")
