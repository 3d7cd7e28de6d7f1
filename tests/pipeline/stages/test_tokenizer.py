"""pipeline/stages/tokenizer.py: joint SentencePiece model with fixed special ids, token stores per split."""

import json

import sentencepiece as spm

from transformer.data import TokenStore
from transformer.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID


def test_joint_model_with_fixed_special_ids(workspace):
    sp = spm.SentencePieceProcessor(model_file=str(workspace.path / "data/tokenizer/spm.model"))
    assert sp.get_piece_size() == 400
    assert (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()) == (PAD_ID, UNK_ID, BOS_ID, EOS_ID)
    # Joint: pieces of both languages are in the one vocabulary.
    pieces = {sp.id_to_piece(i) for i in range(sp.get_piece_size())}
    assert "▁a" in pieces and "▁ein" in pieces


def test_every_split_encoded(workspace):
    stats = json.loads((workspace.path / "data/tokens/stats.json").read_text())
    assert {k: v["pairs"] for k, v in stats["splits"].items()} == {"train": 300, "val": 1014, "test_2016_flickr": 1000}
    store = TokenStore(workspace.path / "data/tokens/train")
    assert len(store) == 300 and store.vocab_size == 400
    src, tgt = store.pair(0)
    sp = spm.SentencePieceProcessor(model_file=str(workspace.path / "data/tokenizer/spm.model"))
    first_en = (workspace.path / "data/corpus/train.en").read_text().splitlines()[0]
    assert sp.decode(src.tolist()) == first_en
    assert 0 < len(tgt) and tgt.max() < 400
