"""DVC stage 2: train a joint SentencePiece BPE model on the training split and encode every
split into the package's token store (§5.1: byte-pair encoding, shared vocabulary)."""

from __future__ import annotations

import argparse
import time

from pipeline import paths
from pipeline.io import read_lines, write_json
from pipeline.params import DataParams, ParamsError, TokenizerParams, load_params, run_stage
from transformer.data import write_token_store
from transformer.tokenizer import Tokenizer, train_tokenizer


def build_tokenizer(data: DataParams, params: TokenizerParams) -> Tokenizer:
    src = read_lines(paths.corpus_file("train", data.src_lang))
    tgt = read_lines(paths.corpus_file("train", data.tgt_lang))
    try:
        return train_tokenizer(src + tgt, paths.TOKENIZER_MODEL, params.vocab_size, model_type=params.model_type,
                               character_coverage=params.character_coverage,
                               input_sentence_size=params.input_sentence_size, seed=params.seed)
    except ValueError as err:
        raise ParamsError(str(err)) from None


def encode_splits(data: DataParams, tokenizer: Tokenizer) -> dict[str, dict[str, int]]:
    """Encode train, valid and test splits into token stores; returns counts per split."""
    counts = {}
    for split in ["train", data.valid_set, *data.test_sets]:
        src = read_lines(paths.corpus_file(split, data.src_lang))
        tgt = read_lines(paths.corpus_file(split, data.tgt_lang))
        store = write_token_store(paths.token_store(split), zip(tokenizer.encode(src), tokenizer.encode(tgt)),
                                  tokenizer.vocab_size)
        counts[split] = {"pairs": len(store), "src_tokens": store.num_tokens("src"), "tgt_tokens": store.num_tokens("tgt")}
    return counts


def main() -> None:
    argparse.ArgumentParser(description=__doc__).parse_args()
    params = load_params()
    start = time.monotonic()
    tokenizer = build_tokenizer(params.data, params.tokenizer)
    counts = encode_splits(params.data, tokenizer)
    write_json(paths.TOKENS_DIR / "stats.json", {"vocab_size": tokenizer.vocab_size, "splits": counts,
                                                  "seconds": round(time.monotonic() - start, 2)})
    for split, c in counts.items():
        print(f"{split:>20}: {c['pairs']:>8} pairs {c['src_tokens']:>10} src {c['tgt_tokens']:>10} tgt tokens")


if __name__ == "__main__":
    run_stage(main)
