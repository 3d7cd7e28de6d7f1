"""Export a trained model to CTranslate2 (an inference engine for Transformer models).

    python -m pipeline.serving.export ctranslate2 [--model models/model.pt]
        [--tokenizer data/tokenizer/spm.model] [--output models/ctranslate2] [--quantization none|int8|...]

The model is described with CTranslate2's own specification API
(``ctranslate2.specs.TransformerSpec``), filled the way its converters fill it
(``ctranslate2/converters/fairseq.py``): the weights map one to one, nothing is retrained.

How this package's Transformer (Vaswani et al., 2017, §3) maps onto the spec:

* post-LN residuals LayerNorm(x + Sublayer(x)) (§3.1) are ``pre_norm=False``; the pre-LN
  variant is ``pre_norm=True`` with the final encoder/decoder LayerNorms;
* token embeddings times sqrt(d_model) (§3.4) are ``scale_embeddings=True``;
* the position table (§3.5) is written out explicitly: CTranslate2's built-in sinusoids
  concatenate the sin and cos halves and start at position 1, ours interleave them
  (sin in even columns, cos in odd ones) and start at position 0;
* ``in_proj`` holds W_Q, W_K, W_V as row blocks (§3.2.2): it is the fused QKV linear of
  self-attention; cross-attention takes rows [:d] as its query linear and rows [d:] as its
  fused key/value linear;
* the pre-softmax projection is the (tied, §3.4) target embedding, without a bias;
* the vocabulary is the SentencePiece pieces in id order; sources get ``</s>`` appended
  (``add_source_eos``) and decoding starts from ``<s>``, as in ``pipeline.serving.translator``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import sentencepiece as spm
import torch
import torch.nn.functional as F
from ctranslate2.specs import common_spec, model_spec, transformer_spec
from torch import nn

from pipeline.config import paths
from pipeline.config.errors import exit_2_on
from transformer.attention import MultiHeadAttention
from transformer.checkpoint import CheckpointError, load_model
from transformer.layers import ACTIVATIONS
from transformer.model import Transformer
from transformer.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID

DEFAULT_OUTPUT = paths.CT2_MODEL
TOKENIZER_NAME = "spm.model"
QUANTIZATIONS = ("none", *model_spec.ACCEPTED_MODEL_TYPES)
# CTranslate2's activation for each function of ``transformer.layers.ACTIVATIONS`` (F.gelu is the erf form).
CT2_ACTIVATIONS = {F.relu: common_spec.Activation.RELU, F.gelu: common_spec.Activation.GELU}


def _array(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float32).numpy().copy()


def _linear(spec: common_spec.LinearSpec, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    spec.weight = _array(weight)
    if bias is not None:
        spec.bias = _array(bias)


def _layer_norm(spec: common_spec.LayerNormSpec, norm: nn.LayerNorm) -> None:
    spec.gamma, spec.beta = _array(norm.weight), _array(norm.bias)


def _attention(spec, attn: MultiHeadAttention, self_attention: bool) -> None:
    """Self-attention: linear[0] = fused QKV. Cross-attention: linear[0] = Q, linear[1] = fused KV."""
    d, w, b = attn.d_model, attn.in_proj.weight, attn.in_proj.bias
    if self_attention:
        _linear(spec.linear[0], w, b)
    else:
        _linear(spec.linear[0], w[:d], b[:d])
        _linear(spec.linear[1], w[d:], b[d:])
    _linear(spec.linear[-1], attn.out_proj.weight, attn.out_proj.bias)


def _ffn(spec, layer: nn.Module) -> None:
    _layer_norm(spec.layer_norm, layer.ffn_residual.norm)
    _linear(spec.linear_0, layer.ffn.linear1.weight, layer.ffn.linear1.bias)
    _linear(spec.linear_1, layer.ffn.linear2.weight, layer.ffn.linear2.bias)


def _inputs(spec, embed: nn.Module) -> None:
    """Token embeddings (scaled by sqrt(d_model) at run time) and our exact position table."""
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    embeddings.weight = _array(embed.tokens.weight)
    spec.scale_embeddings = True
    spec.position_encodings.encodings = _array(embed.positions.table)  # every variant of POSITIONAL has one


def build_spec(model: Transformer, vocabulary: Sequence[str]) -> transformer_spec.TransformerSpec:
    """A validated CTranslate2 ``TransformerSpec`` holding ``model``'s weights.

    ``vocabulary`` is the token of every id (the SentencePiece pieces in id order); it is
    registered as both source and target vocabulary (the model's vocabulary is joint, §5.1).
    """
    c = model.config
    if len(vocabulary) != c.vocab_size:
        raise CheckpointError(f"the tokenizer has {len(vocabulary)} pieces, the model {c.vocab_size}")
    if c.pad_id != PAD_ID:
        raise CheckpointError(f"ModelConfig.pad_id is {c.pad_id}, the tokenizer's is {PAD_ID}")
    activation = CT2_ACTIVATIONS.get(ACTIVATIONS[c.activation])
    if activation is None:
        raise CheckpointError(f"ModelConfig.activation {c.activation!r} has no CTranslate2 equivalent")
    spec = transformer_spec.TransformerSpec.from_config(
        (c.n_encoder_layers, c.n_decoder_layers), c.n_heads, pre_norm=c.norm_first, activation=activation)
    enc, dec = spec.encoder, spec.decoder
    _inputs(enc, model.src_embed)
    for layer_spec, layer in zip(enc.layer, model.encoder_layers):
        _attention(layer_spec.self_attention, layer.self_attn, self_attention=True)
        _layer_norm(layer_spec.self_attention.layer_norm, layer.attn_residual.norm)
        _ffn(layer_spec.ffn, layer)
    _inputs(dec, model.tgt_embed)
    for layer_spec, layer in zip(dec.layer, model.decoder_layers):
        _attention(layer_spec.self_attention, layer.self_attn, self_attention=True)
        _layer_norm(layer_spec.self_attention.layer_norm, layer.self_residual.norm)
        _attention(layer_spec.attention, layer.cross_attn, self_attention=False)
        _layer_norm(layer_spec.attention.layer_norm, layer.cross_residual.norm)
        _ffn(layer_spec.ffn, layer)
    if c.norm_first:
        _layer_norm(enc.layer_norm, model.encoder_norm)
        _layer_norm(dec.layer_norm, model.decoder_norm)
    _linear(dec.projection, model.output.weight, None)

    tokens = list(vocabulary)
    spec.register_source_vocabulary(tokens)
    spec.register_target_vocabulary(tokens)
    config = spec.config
    config.unk_token, config.bos_token, config.eos_token = tokens[UNK_ID], tokens[BOS_ID], tokens[EOS_ID]
    config.decoder_start_token = tokens[BOS_ID]
    config.add_source_bos, config.add_source_eos = False, True
    config.layer_norm_epsilon = float(model.decoder_layers[0].ffn_residual.norm.eps)
    spec.validate()
    return spec


def sentencepiece_vocabulary(tokenizer_file: str | os.PathLike) -> list[str]:
    """The pieces of a SentencePiece model in id order."""
    sp = spm.SentencePieceProcessor(model_file=str(tokenizer_file))
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size())]


def export_ctranslate2(model: Transformer, tokenizer_file: str | os.PathLike, output: str | os.PathLike,
                       quantization: str | None = None) -> Path:
    """Write a CTranslate2 model directory (model.bin, config.json, shared_vocabulary.json
    and the tokenizer as ``spm.model``), replacing ``output`` only once it is complete.

    ``quantization`` is None/"none" (float32 weights) or one of CTranslate2's weight types.
    """
    if quantization not in (None, *QUANTIZATIONS):
        raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
    spec = build_spec(model.eval(), sentencepiece_vocabulary(tokenizer_file))
    spec.register_file(str(tokenizer_file), TOKENIZER_NAME)
    spec.optimize(quantization=None if quantization == "none" else quantization)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        spec.save(str(staged))
        if output.exists():
            shutil.rmtree(output)
        os.replace(staged, output)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    return output


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Export the trained model to an inference engine.")
    sub = parser.add_subparsers(dest="format", required=True)
    ct2 = sub.add_parser("ctranslate2", help="a CTranslate2 model directory")
    ct2.add_argument("--model", type=Path, default=paths.AVERAGED_MODEL)
    ct2.add_argument("--tokenizer", type=Path, default=paths.TOKENIZER_MODEL)
    ct2.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    ct2.add_argument("--quantization", choices=QUANTIZATIONS, default="none")
    args = parser.parse_args(argv)

    def run() -> None:
        if not args.tokenizer.is_file():
            raise CheckpointError(f"tokenizer {args.tokenizer} does not exist")
        out = export_ctranslate2(load_model(args.model), args.tokenizer, args.output, args.quantization)
        print(f"exported {args.model} to {out} (CTranslate2, weights {args.quantization})")

    exit_2_on((CheckpointError,), run)


if __name__ == "__main__":
    main()
