"""transformer/tokenizer.py: SentencePiece with the package's special ids."""

import pytest

from transformer.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID

spm = pytest.importorskip("sentencepiece")

from transformer.tokenizer import Tokenizer, train_tokenizer  # noqa: E402

pytestmark = pytest.mark.fast

CORPUS = [
    "the cat sat on the mat", "a dog runs in the park", "two men are playing football",
    "the children play in the water", "a woman is reading a book", "people walk along the street",
    "ein hund läuft im park", "die katze sitzt auf der matte", "zwei männer spielen fußball",
    "kinder spielen im wasser", "eine frau liest ein buch", "leute gehen die straße entlang",
] * 20


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return train_tokenizer(CORPUS, tmp_path_factory.mktemp("tok") / "spm.model", vocab_size=120, num_threads=1)


def test_special_ids_and_vocab(tokenizer):
    sp = tokenizer.sp
    assert (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()) == (PAD_ID, UNK_ID, BOS_ID, EOS_ID)
    assert tokenizer.vocab_size == 120
    assert tokenizer.model_file.is_file()
    assert [p.name for p in tokenizer.model_file.parent.iterdir()] == ["spm.model"]  # no temporary left


def test_round_trip(tokenizer):
    texts = ["the cat sat on the mat", "zwei männer spielen im park"]
    ids = tokenizer.encode(texts)
    assert all(isinstance(i, int) and 4 <= i < 120 for row in ids for i in row)
    assert tokenizer.decode(ids) == texts
    assert "".join(tokenizer.pieces("the dog")).replace("\u2581", " ").strip() == "the dog"


def test_reload_and_errors(tokenizer, tmp_path):
    again = Tokenizer(tokenizer.model_file)
    assert again.encode(["a dog"]) == tokenizer.encode(["a dog"])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Tokenizer(tmp_path / "missing.model")
    with pytest.raises(ValueError, match="vocab_size 5000 is larger than this corpus supports"):
        train_tokenizer(CORPUS[:12], tmp_path / "big.model", vocab_size=5000, num_threads=1)
    assert not (tmp_path / "big.model").exists()


def test_other_special_ids_are_refused(tmp_path):
    import io
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS), model_writer=model, vocab_size=60,
                                   minloglevel=2, num_threads=1)  # SentencePiece defaults: unk 0, bos 1, eos 2
    path = tmp_path / "default.model"
    path.write_bytes(model.getvalue())
    with pytest.raises(ValueError, match="special ids"):
        Tokenizer(path)
