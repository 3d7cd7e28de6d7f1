"""transformer/model.py: the encoder-decoder (§3): masking, padding, cached decoding, sizes."""

import math

import pytest
import torch

from transformer.config import build_config
from transformer.model import AttentionWeights, DecoderCache, Transformer
from transformer.tokens import BOS_ID, EOS_ID, PAD_ID

from .conftest import pad_batch, tiny_model

pytestmark = pytest.mark.fast


def max_diff(a, b):
    return float((a - b).detach().abs().max())


def test_forward_shapes(model):
    src = torch.randint(4, 24, (3, 7))
    tgt = torch.randint(4, 24, (3, 5))
    memory, src_mask = model.encode(src)
    assert memory.shape == (3, 7, 32) and src_mask.shape == (3, 1, 1, 7)
    assert model(src, tgt).shape == (3, 5, 24)
    assert model.decode(tgt, memory, src_mask).shape == (3, 5, 24)


@torch.no_grad()
def test_causal_mask_leaks_nothing(model):
    src = torch.randint(4, 24, (2, 6))
    tgt = torch.tensor([[BOS_ID, 5, 6, 7, 8, 9], [BOS_ID, 10, 11, 12, 13, 14]])
    logits = model(src, tgt)
    for pos in range(1, 6):
        changed = tgt.clone()
        changed[:, pos] = 20  # a different token at a future position
        other = model(src, changed)
        assert max_diff(logits[:, :pos], other[:, :pos]) < 1e-6, f"position {pos} leaked backwards"
        assert max_diff(logits[:, pos:], other[:, pos:]) > 1e-3  # the changed position itself does change


@torch.no_grad()
def test_padding_leaves_outputs_unchanged(model):
    sentence = [5, 6, 7, 8]
    alone = pad_batch([sentence])                                  # (1, 5): ids + EOS
    batch = pad_batch([sentence, [9, 10, 11, 12, 13, 14, 15, 16]], width=12)  # 7 and 3 pads
    assert batch.shape == (2, 12) and int((batch[0] == PAD_ID).sum()) == 7
    mem_alone, _ = model.encode(alone)
    mem_batch, mask_batch = model.encode(batch)
    assert mask_batch[0, 0, 0].tolist() == [True] * 5 + [False] * 7
    assert max_diff(mem_alone[0], mem_batch[0, :5]) < 1e-5

    tgt = torch.tensor([[BOS_ID, 5, 6, 7]])
    tgt_batch = torch.tensor([[BOS_ID, 5, 6, 7, PAD_ID, PAD_ID], [BOS_ID, 9, 10, 11, 12, 13]])
    logits_alone = model(alone, tgt)
    logits_batch = model(batch, tgt_batch)
    assert max_diff(logits_alone[0], logits_batch[0, :4]) < 1e-5
    # And the second sentence is unaffected by the first's presence.
    logits_second = model(pad_batch([[9, 10, 11, 12, 13, 14, 15, 16]]), tgt_batch[1:])
    assert max_diff(logits_second[0], logits_batch[1]) < 1e-5


@torch.no_grad()
@pytest.mark.parametrize("overrides", [{}, {"norm_first": True}, {"positional": "learned"},
                                       {"share_embeddings": False, "activation": "gelu"}])
def test_cached_step_by_step_decoding_equals_full(overrides):
    model = tiny_model(**overrides)
    src = pad_batch([[5, 6, 7, 8, 9], [10, 11, 12]])
    tgt = torch.cat([torch.full((2, 1), BOS_ID), torch.randint(4, 24, (2, 7))], dim=1)  # (2, 8)
    memory, src_mask = model.encode(src)
    full = model.decode(tgt, memory, src_mask)

    cache = model.new_cache()
    assert isinstance(cache, DecoderCache) and cache.length == 0
    steps = []
    for i in range(tgt.size(1)):
        steps.append(model.decode(tgt[:, i:i + 1], memory, src_mask, cache))
        assert cache.length == i + 1
    assert max_diff(torch.cat(steps, 1), full) < 1e-5

    cache = model.new_cache()  # two tokens at a time
    pairs = [model.decode(tgt[:, i:i + 2], memory, src_mask, cache) for i in range(0, 8, 2)]
    assert cache.length == 8
    assert max_diff(torch.cat(pairs, 1), full) < 1e-5

    cache = model.new_cache()  # uneven chunks: 3, 1, 4
    chunks = [model.decode(tgt[:, a:b], memory, src_mask, cache) for a, b in ((0, 3), (3, 4), (4, 8))]
    assert max_diff(torch.cat(chunks, 1), full) < 1e-5


@torch.no_grad()
def test_reorder_cache_follows_rows(model):
    src = pad_batch([[5, 6, 7], [8, 9, 10, 11]])
    tgt = torch.tensor([[BOS_ID, 5, 6], [BOS_ID, 7, 8]])
    memory, src_mask = model.encode(src)
    cache = model.new_cache()
    model.decode(tgt[:, :2], memory, src_mask, cache)
    index = torch.tensor([1, 1, 0])
    model.reorder_cache(cache, index)  # three rows from two: the cross-attention cache follows memory
    memory, src_mask = model.select_sentences(memory, src_mask, index, cache)
    step = model.decode(tgt[index, 2:3], memory, src_mask, cache)
    full = model.decode(tgt[index], memory, src_mask)
    assert max_diff(step[:, 0], full[:, 2]) < 1e-5


@torch.no_grad()
def test_select_sentences_with_memory_shared_by_groups(model):
    """Beam search: two hypotheses per sentence share one memory row; dropping sentence 0
    keeps hypothesis rows 3, 2 (``reorder_cache``) and memory row 1 (``select_sentences``)."""
    src = pad_batch([[5, 6, 7], [8, 9, 10, 11]])
    tgt = torch.tensor([[BOS_ID, 5, 6], [BOS_ID, 7, 8], [BOS_ID, 9, 10], [BOS_ID, 11, 12]])
    memory, src_mask = model.encode(src)
    cache = model.new_cache()
    model.decode(tgt[:, :2], memory, src_mask, cache)
    assert cache.cross_attn[0].k.size(0) == 2 and cache.self_attn[0].k.size(0) == 4
    model.reorder_cache(cache, torch.tensor([3, 2]))
    kept_memory, kept_mask = model.select_sentences(memory, src_mask, torch.tensor([1]), cache)
    assert torch.equal(kept_memory, memory[1:]) and torch.equal(kept_mask, src_mask[1:])
    step = model.decode(tgt[[3, 2], 2:3], kept_memory, kept_mask, cache)
    assert cache.cross_attn[0].k.size(0) == 1 and cache.self_attn[0].k.size(0) == 2
    full = model.decode(tgt[[3, 2]], memory[[1, 1]], src_mask[[1, 1]])
    assert max_diff(step[:, 0], full[:, 2]) < 1e-5


@torch.no_grad()
def test_decode_step_is_the_log_softmax_of_the_last_position(model):
    src = pad_batch([[5, 6, 7], [8, 9, 10, 11]])
    tgt = torch.tensor([[BOS_ID, 5, 6], [BOS_ID, 7, 8]])
    memory, src_mask = model.encode(src)
    cache = model.new_cache()
    steps = [model.decode_step(tgt[:, i:i + 1], memory, src_mask, cache) for i in range(3)]
    full = torch.log_softmax(model.decode(tgt, memory, src_mask), dim=-1)
    assert steps[0].shape == (2, 24) and steps[0].dtype == torch.float32
    assert max_diff(torch.stack(steps, 1), full) < 1e-5
    assert torch.allclose(steps[-1].exp().sum(-1), torch.ones(2))


def test_weight_tying():
    model = tiny_model()
    assert model.output.weight is model.tgt_embed.tokens.weight
    assert model.src_embed.tokens is model.tgt_embed.tokens
    separate = tiny_model(share_embeddings=False)
    assert separate.src_embed.tokens is not separate.tgt_embed.tokens
    assert separate.output.weight is separate.tgt_embed.tokens.weight  # §3.4: target embedding = pre-softmax
    assert separate.num_parameters() == model.num_parameters() + 24 * 32


def test_embedding_scaled_and_pad_row_zero(model):
    emb = model.src_embed
    assert emb.scale == pytest.approx(math.sqrt(32))
    assert float(emb.tokens.weight.detach()[PAD_ID].abs().max()) == 0.0
    ids = torch.tensor([[5, 6, PAD_ID]])
    x = emb(ids)
    expected = emb.tokens.weight[ids] * math.sqrt(32) + emb.positions(3)
    assert torch.allclose(x, expected, atol=1e-6)
    assert torch.allclose(emb(ids[:, 1:], offset=1), expected[:, 1:], atol=1e-6)
    # The embedding weights have std about d^-1/2, so scaled embeddings have unit scale.
    assert 0.8 < float(emb.tokens.weight.detach()[4:].std()) * math.sqrt(32) < 1.2


def test_source_mask(model):
    src = torch.tensor([[5, EOS_ID, PAD_ID], [5, 6, EOS_ID]])
    assert model.source_mask(src).tolist() == [[[[True, True, False]]], [[[True, True, True]]]]


@torch.no_grad()
def test_attention_weights_are_collected(model):
    src = pad_batch([[5, 6, 7], [8, 9, 10, 11]])  # (2, 5)
    tgt = torch.tensor([[BOS_ID, 5, 6], [BOS_ID, 7, 8]])
    weights = AttentionWeights()
    logits = model(src, tgt, weights)
    assert torch.allclose(logits, model(src, tgt), atol=1e-6)
    assert len(weights.encoder) == len(weights.decoder_self) == len(weights.cross) == 2
    assert weights.encoder[0].shape == (2, 4, 5, 5)
    assert weights.decoder_self[1].shape == (2, 4, 3, 3)
    assert weights.cross[0].shape == (2, 4, 3, 5)
    for w in (*weights.encoder, *weights.decoder_self, *weights.cross):
        assert torch.allclose(w.sum(-1), torch.ones(w.shape[:-1]), atol=1e-5)
    assert float(weights.decoder_self[0][0, 0].triu(1).abs().max()) == 0.0
    assert float(weights.cross[0][0, :, :, 4].abs().max()) == 0.0  # the pad of sentence 0


def test_pre_ln_has_final_norms():
    post, pre = tiny_model(), tiny_model(norm_first=True)
    assert isinstance(post.encoder_norm, torch.nn.Identity)
    assert isinstance(pre.encoder_norm, torch.nn.LayerNorm) and isinstance(pre.decoder_norm, torch.nn.LayerNorm)
    assert pre.num_parameters() == post.num_parameters() + 2 * 2 * 32


def test_too_long_target_raises(model):
    memory, src_mask = model.encode(torch.tensor([[5, EOS_ID]]))
    with pytest.raises(ValueError, match="max_positions"):
        model.decode(torch.full((1, 257), 5), memory, src_mask)


def expected_parameters(v, d, ff, n_enc, n_dec):
    attention = 4 * d * d + 4 * d          # in_proj (3d x d + 3d) and out_proj (d x d + d)
    ffn = 2 * d * ff + ff + d
    norm = 2 * d
    return v * d + n_enc * (attention + ffn + 2 * norm) + n_dec * (2 * attention + ffn + 3 * norm)


def test_tiny_parameter_count(model):
    assert model.num_parameters() == expected_parameters(24, 32, 64, 2, 2)


def test_base_parameter_count():
    with torch.device("meta"):
        base = Transformer(build_config("base", 37000))
    n = base.num_parameters()
    assert 62_000_000 <= n <= 64_000_000
    assert n == expected_parameters(37000, 512, 2048, 6, 6) == 63_082_496


def test_big_parameter_count():
    with torch.device("meta"):
        big = Transformer(build_config("big", 37000))
    n = big.num_parameters()
    assert 213_000_000 <= n <= 215_000_000
    assert n == expected_parameters(37000, 1024, 4096, 6, 6) == 214_245_376


def test_dropout_is_active_only_in_training():
    model = tiny_model(dropout=0.3)
    src = pad_batch([[5, 6, 7, 8]])
    tgt = torch.tensor([[BOS_ID, 5, 6]])
    model.train()
    torch.manual_seed(1)
    a = model(src, tgt)
    b = model(src, tgt)
    torch.manual_seed(1)
    c = model(src, tgt)
    assert torch.equal(a, c) and max_diff(a, b) > 1e-3
    model.eval()
    assert torch.equal(model(src, tgt), model(src, tgt))
