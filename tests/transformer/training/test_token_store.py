"""transformer/training/token_store.py: the token store (§5.1's corpora on disk)."""

import numpy as np
import pytest

from transformer.training.token_store import TokenStore, write_token_store

pytestmark = pytest.mark.fast


def random_pairs(n, vocab=30, max_len=20, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.integers(4, vocab, size=rng.integers(1, max_len + 1)).tolist(),
             rng.integers(4, vocab, size=rng.integers(1, max_len + 1)).tolist()) for _ in range(n)]


def test_token_store_round_trip(tmp_path):
    pairs = random_pairs(50) + [([], [5]), ([7, 8], [])]
    store = write_token_store(tmp_path / "store", pairs, vocab_size=30)
    reopened = TokenStore(tmp_path / "store")
    for s in (store, reopened):
        assert len(s) == 52 and s.vocab_size == 30
        for i, (src, tgt) in enumerate(pairs):
            a, b = s.pair(i)
            assert a.tolist() == src and b.tolist() == tgt
            assert a.dtype == np.int64
            assert s.lengths["src"][i] == len(src) and s.lengths["tgt"][i] == len(tgt)
        assert s.num_tokens("src") == sum(len(p[0]) for p in pairs)
        assert s.num_tokens() == sum(len(p[1]) for p in pairs)
    assert reopened.tokens["src"].dtype == np.uint16  # small vocabularies take 2 bytes per token


def test_token_store_large_vocab_and_overwrite(tmp_path):
    big = write_token_store(tmp_path / "s", [([70000, 4], [65536])], vocab_size=80000)
    assert big.tokens["src"].dtype == np.int32 and big.pair(0)[0].tolist() == [70000, 4]
    again = write_token_store(tmp_path / "s", [([5], [6]), ([7], [8])], vocab_size=10)
    assert len(again) == 2 and len(TokenStore(tmp_path / "s")) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]


def test_failed_write_leaves_nothing(tmp_path):
    def pairs():
        yield [5], [6]
        raise RuntimeError("corpus broken")

    with pytest.raises(RuntimeError, match="corpus broken"):
        write_token_store(tmp_path / "s", pairs(), vocab_size=10)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(FileNotFoundError, match="not a token store"):
        TokenStore(tmp_path / "s")
