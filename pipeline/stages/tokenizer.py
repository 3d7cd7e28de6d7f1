"""DVC stage ``tokenizer``: train a joint SentencePiece BPE model on the training split and encode every
split into the package's token store (§5.1: byte-pair encoding, shared vocabulary).

With ``tokenizer.model_from`` set (fine-tuning, see ``train.init_from``) the stage copies that
SentencePiece model instead of training one: initial weights index the pieces of the tokenizer
they were trained with, and a tokenizer retrained on changed data would number them differently.
"""

from __future__ import annotations

import argparse
import codecs
import itertools
import time
from collections.abc import Iterator
from pathlib import Path

from pipeline.config import paths
from pipeline.config.data import DataParams
from pipeline.config.errors import ParamsError
from pipeline.config.loader import load_sections
from pipeline.config.tokenizer import TokenizerParams
from pipeline.data.spec import DataError
from pipeline.stages.runner import run_stage
from pipeline.text.forms import stream
from pipeline.text.names import CHECKPOINT_KEY as TEXT_FORM_KEY
from pipeline.text.names import TextForm
from transformer.atomic import write_bytes, write_json
from transformer.tokenizer import Tokenizer, open_tokenizer, train_tokenizer
from transformer.training.token_store import encode_to_store


def reuse_tokenizer(source: Path, target: Path, vocab_size: int) -> Tokenizer:
    """Copy the SentencePiece model ``source`` to ``target`` (atomically), after checking that it
    is one, with the package's special ids and ``vocab_size`` pieces (``tokenizer.vocab_size``)."""
    try:
        tokenizer = open_tokenizer(source)
    except ValueError as err:
        raise ParamsError(f"params.yaml: tokenizer.model_from {err}") from None
    if tokenizer.vocab_size != vocab_size:
        raise ParamsError(f"params.yaml: tokenizer.model_from {source} has {tokenizer.vocab_size} pieces but "
                          f"tokenizer.vocab_size is {vocab_size}: a reused tokenizer keeps its vocabulary, "
                          f"set tokenizer.vocab_size to {tokenizer.vocab_size}")
    write_bytes(target, source.read_bytes())
    return Tokenizer(target)


def corpus_lines(path: Path) -> Iterator[str]:
    """The lines of a corpus file, streamed (the download stage writes UTF-8, one sentence a line,
    ``\n`` only; ``check_corpus`` has verified both)."""
    with open(path, encoding="utf-8", newline="\n") as f:
        for line in f:
            yield line[:-1] if line.endswith("\n") else line


def count_lines(path: Path, chunk_bytes: int = 1 << 22) -> int:
    """Lines of a strict UTF-8 file, read in chunks (``DataError`` naming the first bad line)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    lines = offset = 0
    last = b""
    with open(path, "rb") as f:
        while chunk := f.read(chunk_bytes):
            pending = len(decoder.getstate()[0])   # bytes of a character cut by the previous chunk
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as err:
                start = offset - pending + err.start
                with open(path, "rb") as g:
                    line = g.read(start).count(b"\n") + 1
                raise DataError(f"{path}: line {line} is not valid UTF-8 ({err.reason} at byte {start})") from None
            lines += chunk.count(b"\n")
            offset += len(chunk)
            last = chunk[-1:]
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError as err:
            raise DataError(f"{path}: line {lines + 1} is not valid UTF-8 "
                            f"({err.reason} at the end of the file)") from None
    return lines + (1 if last not in (b"", b"\n") else 0)


def check_corpus(data: DataParams) -> None:
    """Every split's two files exist, are UTF-8 and have as many lines as each other; checked
    before anything is written (``DataError`` naming the file). Streams: memory does not grow
    with the corpus."""
    for split in dict.fromkeys(["train", data.valid_set, *data.test_sets]):
        counts = {}
        for lang in (data.src_lang, data.tgt_lang):
            path = paths.corpus_file(split, lang)
            if not path.is_file():
                raise DataError(f"{path} does not exist: run the download stage first (dvc repro)")
            counts[path] = count_lines(path)
        (a, na), (b, nb) = counts.items()
        if na != nb:
            raise DataError(f"misaligned corpus: {a} has {na} lines but {b} has {nb}")


def text_form(data: DataParams, params: TokenizerParams) -> TextForm:
    """The form every split is encoded in (``tokenizer.text_form``), for this language pair."""
    return TextForm(params.text_form, data.src_lang, data.tgt_lang)


def split_lines(split: str, lang: str, form: TextForm) -> Iterator[str]:
    """A split's sentences in ``lang``, streamed, in ``form``."""
    return stream(form, corpus_lines(paths.corpus_file(split, lang)), lang)


def build_tokenizer(data: DataParams, params: TokenizerParams) -> Tokenizer:
    """Train the joint model on both sides of the training split in ``tokenizer.text_form``, streamed
    (SentencePiece samples ``input_sentence_size`` sentences itself), or reuse ``tokenizer.model_from``."""
    if params.model_from:
        return reuse_tokenizer(Path(params.model_from), paths.TOKENIZER_MODEL, params.vocab_size)
    form = text_form(data, params)
    texts = itertools.chain(split_lines("train", data.src_lang, form), split_lines("train", data.tgt_lang, form))
    try:
        return train_tokenizer(texts, paths.TOKENIZER_MODEL, params.vocab_size, model_type=params.model_type,
                               character_coverage=params.character_coverage,
                               input_sentence_size=params.input_sentence_size, seed=params.seed)
    except ValueError as err:
        raise ParamsError(str(err)) from None


def encode_splits(data: DataParams, tokenizer: Tokenizer, form: TextForm | None = None) -> dict[str, dict[str, int]]:
    """Encode train, valid and test splits, in ``form`` (default raw), into token stores, streamed in
    chunks; counts per split."""
    form = form or TextForm()
    counts = {}
    for split in dict.fromkeys(["train", data.valid_set, *data.test_sets]):
        store = encode_to_store(tokenizer, split_lines(split, data.src_lang, form),
                                split_lines(split, data.tgt_lang, form), paths.token_store(split))
        counts[split] = {"pairs": len(store), "src_tokens": store.num_tokens("src"),
                         "tgt_tokens": store.num_tokens("tgt")}
    return counts


def main() -> None:
    argparse.ArgumentParser(description=__doc__).parse_args()
    params = load_sections(DataParams, TokenizerParams)
    start = time.monotonic()
    check_corpus(params.data)
    tokenizer = build_tokenizer(params.data, params.tokenizer)
    if params.tokenizer.model_from:
        print(f"tokenizer: {params.tokenizer.model_from} reused ({tokenizer.vocab_size} pieces), not retrained")
    form = text_form(params.data, params.tokenizer)
    if not form.is_raw:
        print(f"text form: {form.name} (both sides lowercased, punctuation-normalized and Moses-tokenized "
              "before SentencePiece)", flush=True)
    counts = encode_splits(params.data, tokenizer, form)
    # No wall time in here: data/tokens is the train stage's input, and a rerun that encodes the
    # same tokens must leave its hash, and so the trained model, untouched. The text form only where
    # it is not raw: a raw run's stats are the bytes they always were.
    write_json(paths.TOKENS_DIR / "stats.json", {"vocab_size": tokenizer.vocab_size, "splits": counts,
                                                  "model_from": params.tokenizer.model_from,
                                                  **({TEXT_FORM_KEY: form.entry()} if not form.is_raw else {})})
    for split, c in counts.items():
        print(f"{split:>20}: {c['pairs']:>8} pairs {c['src_tokens']:>10} src {c['tgt_tokens']:>10} tgt tokens")
    print(f"tokenizer stage: {time.monotonic() - start:.1f} s")


if __name__ == "__main__":
    run_stage(main)
