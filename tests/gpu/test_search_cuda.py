"""Decoding (§6.1) on CUDA, where attention runs in PyTorch's fused kernel: cached step-by-step
decoding equals a full teacher-forced pass, beam 1 equals greedy, a batched beam search equals
one sentence at a time, and the GPU finds what the CPU finds. The CPU versions of these checks are
tests/transformer/test_model.py and test_search.py, whose model and sentences these reuse."""

import pytest
import torch

from tests.gpu import requires_cuda
from tests.transformer.conftest import pad_batch, tiny_model
from tests.transformer.test_search import SENTENCES
from transformer.search import beam_search, greedy_search, length_penalty
from transformer.tokens import BOS_ID

pytestmark = [requires_cuda, pytest.mark.fast]
CUDA = torch.device("cuda")


@torch.no_grad()
@pytest.mark.parametrize("overrides", [{}, {"norm_first": True}])
def test_cached_decoding_equals_full_decoding(overrides):
    model = tiny_model(**overrides).to(CUDA)
    src = pad_batch([[5, 6, 7, 8, 9], [10, 11, 12]]).to(CUDA)
    g = torch.Generator().manual_seed(0)
    tgt = torch.cat([torch.full((2, 1), BOS_ID), torch.randint(4, 24, (2, 7), generator=g)], dim=1).to(CUDA)
    memory, src_mask = model.encode(src)
    full = model.decode(tgt, memory, src_mask)
    for chunks in ([(i, i + 1) for i in range(8)], [(0, 3), (3, 4), (4, 8)]):  # one at a time; uneven
        cache = model.new_cache()
        steps = [model.decode(tgt[:, a:b], memory, src_mask, cache) for a, b in chunks]
        assert cache.length == 8
        torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_one_equals_greedy(seed):
    model = tiny_model(seed=seed).to(CUDA)
    src = pad_batch(SENTENCES).to(CUDA)
    greedy = greedy_search(model, src, max_len_b=8)
    beam = beam_search(model, src, beam_size=1, alpha=0.6, max_len_b=8)
    assert beam.hypotheses == greedy.hypotheses
    for hyp, g_score, b_score in zip(greedy.hypotheses, greedy.scores, beam.scores):
        assert b_score * length_penalty(len(hyp) + 1, 0.6) == pytest.approx(g_score, abs=1e-4)


def test_batched_beam_equals_one_sentence_at_a_time():
    model = tiny_model(seed=3).to(CUDA)
    batched = beam_search(model, pad_batch(SENTENCES).to(CUDA), beam_size=3, max_len_b=6)
    for i, sentence in enumerate(SENTENCES):
        alone = beam_search(model, pad_batch([sentence]).to(CUDA), beam_size=3, max_len_b=6)
        assert alone.hypotheses[0] == batched.hypotheses[i]
        assert alone.scores[0] == pytest.approx(batched.scores[i], abs=1e-4)


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_gpu_decodes_what_the_cpu_decodes(search):
    model = tiny_model(seed=5)
    src = pad_batch(SENTENCES)
    decode = (lambda m, s: greedy_search(m, s, max_len_b=8)) if search == "greedy" else \
        (lambda m, s: beam_search(m, s, beam_size=4, max_len_b=8))
    on_cpu = decode(model, src)
    on_gpu = decode(model.to(CUDA), src.to(CUDA))
    assert on_gpu.hypotheses == on_cpu.hypotheses
    assert on_gpu.scores == pytest.approx(on_cpu.scores, abs=1e-4)
