"""pipeline/stages/tokenizer.py: joint SentencePiece model with fixed special ids, token stores per split."""

import json

import pytest
import sentencepiece as spm

from transformer.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from transformer.training.token_store import TokenStore

pytestmark = pytest.mark.fast


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


def test_a_rerun_writes_the_same_bytes(workspace, tmp_path, monkeypatch):
    """data/tokens and data/tokenizer feed the train stage: a rerun on the same corpus and params
    (a new tokenizer.py, say) must leave their DVC hashes alone, or dvc repro retrains for nothing."""
    import shutil

    from pipeline.stages import tokenizer as stage

    copy = tmp_path / "repo"
    shutil.copytree(workspace.path / "data" / "corpus", copy / "data" / "corpus")
    shutil.copy(workspace.path / "params.yaml", copy / "params.yaml")
    monkeypatch.chdir(copy)
    monkeypatch.setattr("sys.argv", ["pipeline.stages.tokenizer"])

    def snapshot():
        return {p.relative_to(copy): p.read_bytes() for d in ("data/tokens", "data/tokenizer")
                for p in sorted((copy / d).rglob("*")) if p.is_file()}

    stage.main()
    first = snapshot()
    stage.main()
    assert len(first) == 17 and snapshot() == first  # 3 splits x 5 files, stats.json, spm.model


def reuse_setup(workspace, tmp_path, monkeypatch, vocab_size):
    """A copy of the workspace's corpus and params, with tokenizer.model_from naming another
    SentencePiece model (300 pieces, trained on the first 200 training pairs only)."""
    import shutil

    import yaml

    from pipeline.data.text_files import read_lines
    from transformer.tokenizer import train_tokenizer

    copy = tmp_path / "repo"
    shutil.copytree(workspace.path / "data" / "corpus", copy / "data" / "corpus")
    corpus = copy / "data" / "corpus"
    champion = tmp_path / "champion" / "spm.model"
    train_tokenizer(read_lines(corpus / "train.en")[:200] + read_lines(corpus / "train.de")[:200], champion, 300)
    params = yaml.safe_load((workspace.path / "params.yaml").read_text())
    params["tokenizer"].update(vocab_size=vocab_size, model_from=str(champion))
    (copy / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.chdir(copy)
    monkeypatch.setattr("sys.argv", ["pipeline.stages.tokenizer"])
    return copy, champion


def test_model_from_is_copied_not_retrained_and_encodes_every_split(workspace, tmp_path, monkeypatch):
    from pipeline.stages import tokenizer as stage

    copy, champion = reuse_setup(workspace, tmp_path, monkeypatch, vocab_size=300)
    stage.main()
    assert (copy / "data/tokenizer/spm.model").read_bytes() == champion.read_bytes()
    # a tokenizer trained here (400 pieces, all 300 pairs) would differ
    assert champion.read_bytes() != (workspace.path / "data/tokenizer/spm.model").read_bytes()
    stats = json.loads((copy / "data/tokens/stats.json").read_text())
    assert stats["vocab_size"] == 300 and stats["model_from"] == str(champion)
    assert {k: v["pairs"] for k, v in stats["splits"].items()} == {"train": 300, "val": 1014, "test_2016_flickr": 1000}
    sp = spm.SentencePieceProcessor(model_file=str(champion))
    for split in ("train", "val", "test_2016_flickr"):
        store = TokenStore(copy / "data/tokens" / split)
        assert store.vocab_size == 300
        src, tgt = store.pair(0)
        assert src.tolist() == sp.encode((copy / f"data/corpus/{split}.en").read_text().splitlines()[0])
        assert tgt.tolist() == sp.encode((copy / f"data/corpus/{split}.de").read_text().splitlines()[0])


def test_model_from_with_another_vocab_size_is_one_clear_error(workspace, tmp_path, monkeypatch, capsys):
    import pytest

    from pipeline.stages import tokenizer as stage
    from pipeline.stages.runner import run_stage

    copy, champion = reuse_setup(workspace, tmp_path, monkeypatch, vocab_size=400)
    with pytest.raises(SystemExit) as exit_:
        run_stage(stage.main)
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: params.yaml: tokenizer.model_from {champion} has 300 pieces but tokenizer.vocab_size is 400: "
        "a reused tokenizer keeps its vocabulary, set tokenizer.vocab_size to 300"]
    assert not (copy / "data/tokenizer").exists() and not (copy / "data/tokens").exists()


@pytest.mark.parametrize("chunk_bytes", [1, 2, 3, 7, 1 << 20])
def test_count_lines_streams_and_names_the_bad_line(tmp_path, chunk_bytes):
    from pipeline.data.spec import DataError
    from pipeline.stages.tokenizer import count_lines

    good = tmp_path / "good.de"
    good.write_bytes("Grüße\nStraße\n日本\nno newline at the end".encode())
    assert count_lines(good, chunk_bytes) == 4
    bad = tmp_path / "bad.de"
    bad.write_bytes("Grüße\nStraße\n".encode() + b"ab\xc3(\n" + "日本\n".encode())
    with pytest.raises(DataError, match=r"bad.de: line 3 is not valid UTF-8 \(invalid continuation byte at byte 18\)"):
        count_lines(bad, chunk_bytes)
    cut = tmp_path / "cut.de"
    cut.write_bytes("Grüße\n".encode() + "日".encode()[:2])
    with pytest.raises(DataError, match="cut.de: line 2 is not valid UTF-8"):
        count_lines(cut, chunk_bytes)
