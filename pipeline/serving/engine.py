"""The translator of a decoding's engine (``DecodingConfig.engine``): our PyTorch search
(``pipeline.serving.translator``) or the export stage's CTranslate2 model
(``pipeline.serving.ct2_translator``), both with ``translate(sentences, beam_size, alpha, stopping)``.

The one place a caller (the tune and evaluate stages, translate, the pyfunc model, the gate, the
server) turns settings into a translator. Where CTranslate2 is missing or cannot load (no export
in an older version, the GPU machine's CUDA, which the wheel does not support) it decodes with
torch and says so in one line on stderr, so a translation never fails for want of an engine.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

import torch

from pipeline.config.decoding import DecodingConfig
from pipeline.serving.ct2_translator import CT2Translator, EngineUnavailable, load_ct2_translator
from pipeline.serving.translator import Translator, load_translator
from pipeline.text.forms import attach
from pipeline.text.names import text_form_of
from transformer.checkpoint import load_checkpoint, require_model_entries
from transformer.config import ModelConfig
from transformer.precision import default_device

AnyTranslator = Translator | CT2Translator


def load_engine_translator(model: str | os.PathLike | Mapping[str, Any], tokenizer_file: str | os.PathLike,
                           decoding: DecodingConfig, ct2_model: str | os.PathLike | None = None,
                           device: torch.device | str | None = None, model_source: str | None = None,
                           hint: str = "", threads: tuple[int, int] | None = None,
                           fallback: bool = True) -> AnyTranslator:
    """The translator ``decoding.engine`` names: ``ct2_model`` (an exported directory) at
    ``decoding.compute_type`` for ctranslate2, else, or where CTranslate2 is unavailable (a one-line
    warning), ``model`` (a checkpoint file or a loaded one) with our search. ``threads``:
    CTranslate2's (inter_threads, intra_threads). Raises what ``load_translator`` raises, and
    ``EngineUnavailable`` instead of falling back where ``fallback`` is False (the tune stage, which
    says so once and searches torch only). Either engine's tokenizer prepares sources in the text form
    the checkpoint names (``pipeline.text.forms``)."""
    if decoding.engine == "ctranslate2":
        torch_device = torch.device(device) if device is not None else default_device()
        try:
            if ct2_model is None:
                raise EngineUnavailable("has no exported model for this one")
            checkpoint = model if isinstance(model, Mapping) else load_checkpoint(model, "cpu")
            require_model_entries(checkpoint, model_source or str(model))
            max_positions = ModelConfig.from_dict(checkpoint["model_config"]).max_positions
            translator = load_ct2_translator(ct2_model, tokenizer_file, decoding, max_positions,
                                             device="cuda" if torch_device.type == "cuda" else "cpu", threads=threads)
            attach(translator.tokenizer, text_form_of(checkpoint, model_source or str(model)))
            return translator
        except EngineUnavailable as err:
            if not fallback:
                raise
            print(f"warning: decoding with torch instead of ctranslate2: CTranslate2 {err}", file=sys.stderr)
            decoding = decoding.replace(engine="torch")
    return load_translator(model, tokenizer_file, decoding, device, model_source, hint)
