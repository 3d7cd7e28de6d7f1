"""The CTranslate2 engine (pipeline/serving/ct2_translator.py, engine.py) decodes as ours does.

Agreement: on a small model trained to copy, CTranslate2 float32 greedy through ``CT2Translator`` equals
our fp32 greedy (``Translator``) token for token, in one call of sentences of different lengths (one
per-call length limit there, cut to each sentence's), limits reached included. Padding and BOS are never
emitted by either engine, even by a model that prefers them. Where CTranslate2 cannot decode, torch
does, with a one-line warning; CTranslate2 refuses our exact stopping rule.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from pipeline.config.decoding import DecodingConfig
from pipeline.serving.ct2_translator import CT2Translator, load_ct2_translator
from pipeline.serving.engine import load_engine_translator
from pipeline.serving.export import export_ctranslate2
from pipeline.serving.translator import Translator
from transformer.checkpoint import model_checkpoint
from transformer.config import build_config
from transformer.model import Transformer
from transformer.tokenizer import open_tokenizer
from transformer.tokens import BOS_ID, PAD_ID

from . import test_export as exported
from .test_export import VOCAB, probe_sources

pytestmark = pytest.mark.fast

tokenizer_file, trained = exported.tokenizer_file, exported.trained   # the export tests' fixtures

# Greedy is deterministic in both; a near-tie between two tokens can still go either way in the last
# float bits (fused C++ kernels against PyTorch's). None differed when written: at most this many may.
ALLOWED_DIFFERENT = 2
GREEDY = DecodingConfig(beam_size=1, max_len_b=6, batch_sentences=16, stopping="fairseq")


def both(model: Transformer, tokenizer_file, tmp_path, decoding: DecodingConfig) -> tuple[Translator, CT2Translator]:
    out = export_ctranslate2(model, tokenizer_file, tmp_path / "ct2")
    ours = Translator(model, open_tokenizer(tokenizer_file), decoding.replace(engine="torch"), packed=False)
    theirs = load_ct2_translator(out, tokenizer_file, decoding.replace(engine="ctranslate2"),
                                 model.config.max_positions, threads=(1, 1))
    return ours, theirs


@pytest.mark.training
def test_ctranslate2_float32_greedy_equals_ours(trained, tokenizer_file, tmp_path):
    model = trained("post-ln-relu")
    ours, theirs = both(model, tokenizer_file, tmp_path, GREEDY.replace(compute_type="float32"))
    sources = probe_sources()
    random.Random(3).shuffle(sources)   # lengths mixed in every CTranslate2 batch
    mine, other = ours.translate_ids(sources), theirs.translate_ids(sources)
    assert any(len(h) == len(s) + GREEDY.max_len_b for h, s in zip(mine, sources)), "no limit reached"
    assert np.mean([h == s for h, s in zip(mine, sources) if 4 <= len(s) <= 8]) > 0.9, "did not train"
    differ = [(s, a, b) for s, a, b in zip(sources, mine, other) if a != b]
    assert len(differ) <= ALLOWED_DIFFERENT, f"{len(differ)} of {len(sources)} differ, e.g. {differ[:2]}"
    assert len(differ) == 0   # none when written; a tie would show here first, with the sentences above


def prefers_padding_then_bos(model: Transformer) -> Transformer:
    """The last decoder layer's output pinned to beta = e_0 and the output rows of PAD and BOS the
    largest along it: every step's logits rank PAD, then BOS, first (label smoothing's mass, §5.4, in
    the extreme). Post-LN: the final LayerNorm is the last layer's."""
    with torch.no_grad():
        norm = model.decoder_layers[-1].ffn_residual.norm
        norm.weight.zero_()
        norm.bias.zero_()
        norm.bias[0] = 1.0
        model.output.weight[:, 0] = 0.0
        model.output.weight[PAD_ID, 0], model.output.weight[BOS_ID, 0] = 30.0, 20.0
        model.output.weight[5, 0] = 10.0   # then an ordinary piece, until the length limit
    return model.eval()


@pytest.mark.parametrize("beam_size", [1, 4])
def test_neither_engine_emits_padding_or_bos(beam_size, tokenizer_file, tmp_path):
    torch.manual_seed(0)
    model = prefers_padding_then_bos(Transformer(build_config("tiny", VOCAB)))
    ours, theirs = both(model, tokenizer_file, tmp_path, GREEDY.replace(beam_size=beam_size))
    sources = probe_sources()[:14]
    for hypotheses in (ours.translate_ids(sources), theirs.translate_ids(sources)):
        emitted = {t for h in hypotheses for t in h}
        assert emitted and not emitted & {PAD_ID, BOS_ID}, emitted
        assert all(len(h) <= len(s) + GREEDY.max_len_b for h, s in zip(hypotheses, sources))


def test_ctranslate2_refuses_the_exact_rule(tokenizer_file, tmp_path):
    torch.manual_seed(0)
    _, theirs = both(Transformer(build_config("tiny", VOCAB)).eval(), tokenizer_file, tmp_path, GREEDY)
    with pytest.raises(ValueError, match="stopping exact"):
        theirs.translate_ids([[5, 6]], beam_size=4, stopping="exact")
    with pytest.raises(ValueError, match="stopping exact"):
        DecodingConfig(engine="ctranslate2", stopping="exact")


def test_torch_where_ctranslate2_cannot_decode(tokenizer_file, tmp_path, capsys):
    torch.manual_seed(0)
    checkpoint = model_checkpoint(Transformer(build_config("tiny", VOCAB)))
    decoding = GREEDY.replace(engine="ctranslate2")
    translator = load_engine_translator(checkpoint, tokenizer_file, decoding, ct2_model=tmp_path / "none",
                                        device="cpu")
    assert isinstance(translator, Translator) and translator.decoding.engine == "torch"
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: decoding with torch instead of ctranslate2: CTranslate2 "
                                                   f"has no exported model in {tmp_path / 'none'}"), lines
    export_ctranslate2(Transformer(build_config("tiny", VOCAB)), tokenizer_file, tmp_path / "ct2")
    chosen = load_engine_translator(checkpoint, tokenizer_file, decoding, ct2_model=tmp_path / "ct2", device="cpu")
    assert isinstance(chosen, CT2Translator) and not capsys.readouterr().err
