"""Translate text with the trained (averaged) model: one sentence a line, from stdin or files.

    echo "A man is riding a bike." | python -m pipeline.translate
    python -m pipeline.translate --input news.en --output news.de --beam-size 5 --alpha 1.0
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline import paths
from pipeline.translation import Translator
from transformer.checkpoint import CheckpointError, load_model
from transformer.precision import default_device
from transformer.tokenizer import Tokenizer


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=paths.AVERAGED_MODEL)
    parser.add_argument("--tokenizer", type=Path, default=paths.TOKENIZER_MODEL)
    parser.add_argument("--input", type=Path, help="source file (default: stdin)")
    parser.add_argument("--output", type=Path, help="translation file (default: stdout)")
    parser.add_argument("--beam-size", type=int, default=4, help="1 = greedy (default: 4, §6.1)")
    parser.add_argument("--alpha", type=float, default=0.6, help="length penalty alpha (default: 0.6, §6.1)")
    parser.add_argument("--max-len-b", type=int, default=50, help="output length limit: source length + this")
    parser.add_argument("--batch-sentences", type=int, default=64)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                        help="decoding precision (bf16: faster on CPUs with AVX512-BF16/AMX and on GPUs)")
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
