"""Decoding a split of the corpus with the pipeline's averaged model, as the tune and evaluate
stages do (beam search, §6.1): the model and its tokenizer as a translator of ``evaluate``'s engine
(our search, or the export stage's CTranslate2 model of the same weights) with its settings, and a
split's source and reference files.

Shared by the two stages and by neither's module, so that each stage depends on the code it runs
and no other stage's.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.config import paths
from pipeline.config.decoding import RULES, DecodingConfig
from pipeline.config.errors import ParamsError
from pipeline.serving.engine import AnyTranslator, load_engine_translator
from transformer.checkpoint import load_checkpoint

if TYPE_CHECKING:
    import torch

    from pipeline.config.params import Params


def load_averaged() -> dict[str, Any]:
    """The averaged model checkpoint (config and weights)."""
    for needed in (paths.AVERAGED_MODEL, paths.TOKENIZER_MODEL):
        if not needed.is_file():
            raise ParamsError(f"{needed} does not exist: run the earlier stages first (dvc repro)")
    return load_checkpoint(paths.AVERAGED_MODEL)


def build_translator(checkpoint: dict[str, Any], params: Params, beam_size: int | None = None,
                     alpha: float | None = None, device: torch.device | None = None, fallback: bool = True,
                     **settings: Any) -> AnyTranslator:
    """The averaged model and its tokenizer (checked to be the model's) decoding with ``evaluate``'s
    settings, ``beam_size``, ``alpha`` and other ``settings`` (``engine``, ``compute_type``, ...) where
    given (None: the paper's until set on the translator). Engine ctranslate2 decodes the export
    stage's model (torch, with a warning, where CTranslate2 cannot; ``EngineUnavailable`` instead
    where ``fallback`` is False)."""
    given = {"beam_size": beam_size, "alpha": alpha, **settings}
    # Checked together (evaluate.engine ctranslate2 with a null stopping: the one given here, not the default).
    decoding = DecodingConfig.of({**{name: getattr(params.evaluate, name, None) for name in RULES},
                                  **{k: v for k, v in given.items() if v is not None}})
    try:
        return load_engine_translator(checkpoint, paths.TOKENIZER_MODEL, decoding, paths.CT2_MODEL, device,
                                      str(paths.AVERAGED_MODEL), hint="rerun the pipeline (dvc repro)",
                                      fallback=fallback)
    except ValueError as err:   # not a usable SentencePiece model
        raise ParamsError(str(err)) from None


def split_files(split: str, key: str, params: Params) -> tuple[Path, Path]:
    """The source and reference files of ``split`` (a ParamsError naming ``key`` when missing)."""
    data = params.data
    files = paths.corpus_file(split, data.src_lang), paths.corpus_file(split, data.tgt_lang)
    for f in files:
        if not f.is_file():
            label = "test set" if key == "data.test_sets" else "validation set"
            raise ParamsError(f"{label} {split}: {f} does not exist ({key})")
    return files
