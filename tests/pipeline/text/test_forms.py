"""pipeline/text/forms.py and names.py: the literature's form as upstream's scripts make it, streamed in chunks as a
whole; detokenized for readers; stored only where it is not raw; an unknown or damaged entry named;
a tokenizer preparing what it encodes."""

from __future__ import annotations

import pytest

from pipeline.scoring.literature_bleu import lc_norm_tok
from pipeline.text import forms
from pipeline.text.forms import attach, for_reader, prepare, stream
from pipeline.text.names import TextForm, TextFormError, from_entry, text_form_of
from transformer.tokenizer import Tokenizer, train_tokenizer

pytestmark = pytest.mark.fast

LITERATURE = TextForm("lc_norm_tok", "en", "de")
LINES = ["A man in a \u201cblue\u201d shirt.", "Two dogs' toys & a ball!", "It's 5 o'clock..."]


def test_raw_changes_nothing_and_stores_nothing():
    raw = TextForm()
    assert raw.is_raw and not raw.literature and raw.entry() is None
    assert prepare(raw, LINES, "en") == LINES and list(stream(raw, iter(LINES), "en")) == LINES
    assert for_reader(raw, LINES) == LINES
    assert text_form_of({}) == raw and text_form_of({"callbacks": {}}) == raw


def test_the_literature_form_is_upstreams_scripts_on_each_side():
    assert prepare(LITERATURE, LINES, "en") == lc_norm_tok(LINES, "en")
    assert prepare(LITERATURE, LINES, "en") == ['a man in a &quot; blue &quot; shirt .',
                                               'two dogs &apos; toys &amp; a ball !',
                                               'it &apos;s 5 o &apos;clock ...']
    assert LITERATURE.entry() == {"name": "lc_norm_tok", "src_lang": "en", "tgt_lang": "de"}


def test_a_stream_is_prepared_in_chunks_as_the_whole(monkeypatch):
    monkeypatch.setattr(forms, "CHUNK_LINES", 2)
    lines = LINES * 3 + ["Last."]   # 10 lines: chunks of 2, the last one full
    assert list(stream(LITERATURE, iter(lines), "de")) == lc_norm_tok(lines, "de")
    assert list(stream(LITERATURE, iter(lines[:7]), "de")) == lc_norm_tok(lines[:7], "de")   # a short last chunk


def test_readers_get_detokenized_unescaped_text():
    assert for_reader(LITERATURE, ["ein mann &apos;s hut , &quot; blau &quot; .", "a &amp; b ?"]) == [
        "ein mann 's hut, \"blau\".", "a & b?"]


@pytest.mark.parametrize("entry, message", [
    ({"name": "uppercase", "src_lang": "en", "tgt_lang": "de"}, "unknown text form 'uppercase'"),
    ({"name": "lc_norm_tok", "src_lang": "", "tgt_lang": "de"}, "needs its source and target languages"),
    ({"name": "lc_norm_tok"}, "must be a mapping of name, src_lang and tgt_lang"),
    ("lc_norm_tok", "must be a mapping of name, src_lang and tgt_lang"),
])
def test_a_bad_entry_is_one_line_naming_its_file(entry, message):
    with pytest.raises(TextFormError) as err:
        text_form_of({"text_form": entry}, "models/model.pt")
    assert str(err.value).startswith("models/model.pt: ") and message in str(err.value)
    assert "\n" not in str(err.value)


def test_a_training_checkpoint_names_it_under_its_callbacks():
    entry = LITERATURE.entry()
    assert text_form_of({"callbacks": {"text_form": entry}}) == LITERATURE == from_entry(entry)


def test_an_attached_tokenizer_encodes_the_prepared_text(tmp_path):
    corpus = prepare(LITERATURE, LINES * 40, "en")
    tokenizer = train_tokenizer(corpus, tmp_path / "spm.model", vocab_size=60)
    plain = tokenizer.encode(LINES)
    attach(tokenizer, LITERATURE)
    assert tokenizer.encode(LINES) == Tokenizer(tmp_path / "spm.model").encode(lc_norm_tok(LINES, "en")) != plain
    assert tokenizer.pieces(LINES[0]) == tokenizer.sp.encode(lc_norm_tok(LINES[:1], "en")[0], out_type=str)
    assert tokenizer.for_reader(["a &amp; b ."]) == ["a & b."]
    attach(tokenizer, TextForm())   # back to raw
    assert tokenizer.encode(LINES) == plain and tokenizer.for_reader(["a &amp; b ."]) == ["a &amp; b ."]
