"""transformer/training/batching.py: token-count batching (§5.1), collation and each update's
place in the data."""

import numpy as np
import pytest
import torch

from transformer.tokens import BOS_ID, EOS_ID, PAD_ID
from transformer.training.batching import Batch, DataPosition, TokenBatchSampler, collate, update_positions
from transformer.training.token_store import write_token_store

from .test_token_store import random_pairs

pytestmark = pytest.mark.fast


def lengths(n=400, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(1, 40, size=n), rng.integers(1, 40, size=n)


def test_batches_respect_max_tokens_and_cover_every_index_once():
    src, tgt = lengths()
    sampler = TokenBatchSampler(src, tgt, max_tokens=120, seed=3)
    for epoch in range(3):
        batches = sampler.batches(epoch)
        for batch in batches:
            assert len(batch) >= 1
            width = int(np.maximum(src[batch] + 1, tgt[batch] + 1).max())  # +1: EOS/BOS
            assert width * len(batch) <= 120
        seen = np.concatenate(batches)
        assert sorted(seen.tolist()) == list(range(400))  # every index exactly once
    # Batching by length packs well: most padded space holds real tokens (src and tgt lengths here
    # are independent, the worst case for sorting by target length).
    batches = sampler.batches(0)
    real = sum(int(np.maximum(src[b], tgt[b]).sum() + len(b)) for b in batches)
    padded = sum(int(np.maximum(src[b] + 1, tgt[b] + 1).max()) * len(b) for b in batches)
    assert real / padded > 0.85


def test_batches_are_reproducible_and_change_with_epoch():
    src, tgt = lengths()
    a = TokenBatchSampler(src, tgt, max_tokens=120, seed=3)
    b = TokenBatchSampler(src, tgt, max_tokens=120, seed=3)
    same = [x.tolist() for x in a.batches(1)]
    assert same == [x.tolist() for x in b.batches(1)]
    assert same != [x.tolist() for x in a.batches(2)]
    assert same != [x.tolist() for x in TokenBatchSampler(src, tgt, max_tokens=120, seed=4).batches(1)]
    assert [x.tolist() for x in a] == [x.tolist() for x in a.batches(0)]


def test_world_size_two_splits_batches_disjointly():
    src, tgt = lengths()
    whole = TokenBatchSampler(src, tgt, max_tokens=120, seed=3).batches(5)
    ranks = [TokenBatchSampler(src, tgt, max_tokens=120, seed=3, rank=r, world_size=2).batches(5)
             for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) == len(whole) // 2
    seen = [set(np.concatenate(r).tolist()) for r in ranks]
    assert not seen[0] & seen[1]
    usable = len(whole) - len(whole) % 2
    assert [x.tolist() for x in ranks[0]] == [x.tolist() for x in whole[0:usable:2]]
    assert [x.tolist() for x in ranks[1]] == [x.tolist() for x in whole[1:usable:2]]


def test_too_long_pairs_are_skipped():
    src = np.array([3, 10, 50, 4])
    tgt = np.array([3, 60, 4, 4])
    sampler = TokenBatchSampler(src, tgt, max_tokens=55, max_positions=20, shuffle=False)
    assert sampler.skipped == 2
    assert sorted(np.concatenate(sampler.batches(0)).tolist()) == [0, 3]
    sampler = TokenBatchSampler(src, tgt, max_tokens=60, shuffle=False)
    assert sampler.skipped == 1  # tgt 60 + 1 > 60
    with pytest.raises(ValueError, match="max_tokens must be positive"):
        TokenBatchSampler(src, tgt, max_tokens=0)


def test_unshuffled_batches_are_sorted_by_length():
    src, tgt = lengths(100)
    batches = TokenBatchSampler(src, tgt, max_tokens=200, shuffle=False).batches(0)
    order = np.concatenate(batches)
    assert (np.diff(tgt[order]) >= 0).all()
    assert [x.tolist() for x in batches] == [x.tolist() for x in
                                             TokenBatchSampler(src, tgt, 200, shuffle=False).batches(7)]


def test_source_order_alternates_between_target_lengths():
    src, tgt = np.array([1, 5, 3, 2, 6, 4]), np.array([2, 2, 2, 3, 3, 3])
    order = np.concatenate(TokenBatchSampler(src, tgt, max_tokens=100, shuffle=False).batches(0))
    # target length 2 (+1 = 3, odd): sources descending; target length 3 (+1 = 4, even): ascending
    assert src[order].tolist() == [5, 3, 1, 2, 4, 6]


def test_padding_under_five_percent_on_multi30k_lengths():
    """§5.1 batches pairs "by approximate sequence length"; on Multi30k-like lengths (29k pairs,
    ~14 source and ~15 target pieces) 4096-token batches pad less than 5% of tokens."""
    rng = np.random.default_rng(0)
    src = np.clip(rng.normal(14, 5, 29_000).astype(int), 3, 60)
    tgt = np.clip((src * rng.normal(1.1, 0.15, src.size)).astype(int), 3, 70)
    sampler = TokenBatchSampler(src, tgt, max_tokens=4096, seed=1)
    fraction = sampler.padding_fraction()
    assert 0.0 < fraction < 0.05
    assert sampler.padding_fraction(epoch=3) < 0.05
    padded8 = TokenBatchSampler(src, tgt, max_tokens=4096, seed=1, pad_multiple=8)
    assert padded8.padding_fraction() > fraction  # widths rounded up to multiples of 8 pad more


def test_collate_places_bos_eos_and_pads(tmp_path):
    store = write_token_store(tmp_path / "s", [([5, 6, 7], [8, 9]), ([10], [11, 12, 13, 14])], vocab_size=20)
    batch = collate(store, [0, 1])
    assert isinstance(batch, Batch)
    assert batch.src.tolist() == [[5, 6, 7, EOS_ID], [10, EOS_ID, PAD_ID, PAD_ID]]
    assert batch.tgt_in.tolist() == [[BOS_ID, 8, 9, PAD_ID, PAD_ID], [BOS_ID, 11, 12, 13, 14]]
    assert batch.tgt_out.tolist() == [[8, 9, EOS_ID, PAD_ID, PAD_ID], [11, 12, 13, 14, EOS_ID]]
    assert batch.n_target_tokens == 3 + 5
    assert batch.src.dtype == torch.long

    padded = collate(store, [1, 0], pad_multiple=8)
    assert padded.src.shape == (2, 8) and padded.tgt_in.shape == (2, 8)
    assert padded.tgt_out[0].tolist() == [11, 12, 13, 14, EOS_ID, PAD_ID, PAD_ID, PAD_ID]
    assert padded.n_target_tokens == 8
    moved = padded.to("cpu")
    assert torch.equal(moved.tgt_out, padded.tgt_out)
    assert moved.n_target_tokens == 8 and Batch(moved.src, moved.tgt_in, moved.tgt_out).n_target_tokens == 8


@pytest.mark.parametrize("pad_multiple", [1, 3, 8])
def test_collate_builds_every_row_as_the_sentence_by_sentence_definition(tmp_path, pad_multiple):
    """The batch, built in a few array operations, row for row as the definition reads: source + EOS,
    BOS + target, target + EOS, each padded to its longest row rounded up (empty sentences included)."""
    pairs = random_pairs(300, vocab=500, max_len=40, seed=4) + [([], [5]), ([7, 8], []), ([], [])]
    store = write_token_store(tmp_path / "s", pairs, vocab_size=500)   # uint16 ids on disk

    def padded(rows):
        width = -(-max(len(r) for r in rows) // pad_multiple) * pad_multiple
        return [r + [PAD_ID] * (width - len(r)) for r in rows]

    sampler = TokenBatchSampler(store.lengths["src"], store.lengths["tgt"], 300, seed=2, pad_multiple=pad_multiple)
    batches = sampler.batches(0) + [np.array([300, 301, 302]), np.array([302])]
    for idx in batches:
        batch = collate(store, idx, pad_multiple)
        rows = [pairs[i] for i in idx]
        assert batch.src.tolist() == padded([src + [EOS_ID] for src, _ in rows])
        assert batch.tgt_in.tolist() == padded([[BOS_ID] + tgt for _, tgt in rows])
        assert batch.tgt_out.tolist() == padded([tgt + [EOS_ID] for _, tgt in rows])
        assert batch.n_target_tokens == sum(len(tgt) + 1 for _, tgt in rows)
        assert batch.src.dtype == batch.tgt_in.dtype == batch.tgt_out.dtype == torch.long


def test_update_positions_walk_the_epochs_and_resume_mid_epoch():
    """Each update's ``update_freq`` batches in the sampler's order, ``None`` at each epoch's end
    with the next epoch's start; started from a saved position, the same tail."""
    src, tgt = lengths(200, seed=3)
    sampler = TokenBatchSampler(src, tgt, max_tokens=120, seed=5)
    walk = update_positions(sampler, 2, 0, 0)
    epoch0 = sampler.batches(0)
    usable = len(epoch0) - len(epoch0) % 2
    first = [next(walk) for _ in range(usable // 2 + 1)]
    for k, position in enumerate(first[:-1]):
        assert [list(b) for b in position.group] == [list(b) for b in epoch0[2 * k:2 * k + 2]]
        assert (position.epoch, position.batch_in_epoch) == (0, 2 * k + 2)
    assert first[-1] == DataPosition(None, 1, 0)
    following = [next(walk) for _ in range(3)]
    resumed = update_positions(sampler, 2, 1, 0)
    again = [next(resumed) for _ in range(3)]
    assert [(p.epoch, p.batch_in_epoch) for p in again] == [(p.epoch, p.batch_in_epoch) for p in following]
    assert all(np.array_equal(a, b) for p, q in zip(again, following) for a, b in zip(p.group, q.group))
    mid = update_positions(sampler, 2, 1, 2)
    assert [list(b) for b in next(mid).group] == [list(b) for b in following[1].group]
