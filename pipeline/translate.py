"""Translate text with the trained (averaged) model: one sentence a line, from stdin or files.

    echo "A man is riding a bike." | python -m pipeline.translate
    python -m pipeline.translate --input news.en --output news.de --beam-size 5 --alpha 1.0

Decoding settings default to params.yaml's ``evaluate`` section: what the test scores used.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline import paths
from pipeline.params import PARAMS_FILE, ParamsError, load_params
from pipeline.translation import Translator
from transformer.checkpoint import CheckpointError, load_model
from transformer.precision import default_device
from transformer.tokenizer import Tokenizer


def decoding_defaults(params_file: Path) -> dict[str, object]:
    """The ``evaluate`` section of ``params_file`` (the settings the test scores were measured
    with), or the paper's (§6.1: beam 4, alpha 0.6) when there is no params file."""
    if not params_file.is_file():
        return {"beam_size": 4, "alpha": 0.6, "max_len_b": 50, "batch_sentences": 64, "precision": "fp32"}
    e = load_params(params_file).evaluate
    return {"beam_size": e.beam_size, "alpha": e.alpha, "max_len_b": e.max_len_b,
            "batch_sentences": e.batch_sentences, "precision": e.precision}


def main(argv: list[str] | None = None) -> None:
    try:
        defaults = decoding_defaults(PARAMS_FILE)
    except ParamsError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    source = f"{PARAMS_FILE}'s evaluate section" if PARAMS_FILE.is_file() else "§6.1"
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=paths.AVERAGED_MODEL)
    parser.add_argument("--tokenizer", type=Path, default=paths.TOKENIZER_MODEL)
    parser.add_argument("--input", type=Path, help="source file (default: stdin)")
    parser.add_argument("--output", type=Path, help="translation file (default: stdout)")
    parser.add_argument("--beam-size", type=int, default=defaults["beam_size"],
                        help=f"1 = greedy (default: {defaults['beam_size']}, from {source})")
    parser.add_argument("--alpha", type=float, default=defaults["alpha"],
                        help=f"length penalty alpha (default: {defaults['alpha']}, from {source})")
    parser.add_argument("--max-len-b", type=int, default=defaults["max_len_b"],
                        help=f"output length limit: source length + this (default: {defaults['max_len_b']})")
    parser.add_argument("--batch-sentences", type=int, default=defaults["batch_sentences"])
    parser.add_argument("--precision", choices=["fp32", "bf16"], default=defaults["precision"],
                        help="decoding precision (bf16: faster on CPUs with AVX512-BF16/AMX and on GPUs; "
                             f"default: {defaults['precision']})")
    args = parser.parse_args(argv)
    if args.beam_size < 1:
        parser.error("--beam-size must be at least 1")
    try:
        model = load_model(args.model, default_device())
        tokenizer = Tokenizer(args.tokenizer)
    except (CheckpointError, FileNotFoundError, ValueError) as err:
        print(f"error: {err} (train a model first: make run)", file=sys.stderr)
        sys.exit(2)
    text = args.input.read_text(encoding="utf-8") if args.input else sys.stdin.read()
    sentences = [line.strip() for line in text.splitlines()]
    translator = Translator(model, tokenizer, args.beam_size, args.alpha, args.max_len_b, args.batch_sentences,
                            args.precision)
    non_empty = [s for s in sentences if s]
    translated = iter(translator.translate(non_empty))
    lines = [next(translated) if s else "" for s in sentences]
    output = "".join(f"{line}\n" for line in lines)
    if args.output:
        from pipeline.io import write_text
        write_text(args.output, output)
    else:
        sys.stdout.write(output)


if __name__ == "__main__":
    main()
