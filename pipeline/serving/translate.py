"""Translate text with the trained (averaged) model: one sentence a line, from stdin or files.

    echo "A man is riding a bike." | python -m pipeline.serving.translate
    python -m pipeline.serving.translate --input news.en --output news.de --beam-size 5 --alpha 1.0

Decoding settings default to what the test scores used: params.yaml's ``evaluate`` section, with
the tune stage's choice on the validation set (``reports/tune.json``) for a beam size, alpha or
stopping rule left null there; the paper's (§6.1) where neither says. Input is UTF-8 (a leading byte-order mark
is dropped); a line that is not valid UTF-8 is an error naming its line number, and nothing is
written.
"""

from __future__ import annotations

import argparse
import codecs
import sys
from pathlib import Path
from typing import Any

from pipeline.config import paths
from pipeline.config.params import PARAMS_FILE, TUNE_REPORT, TUNED, ParamsError, decoding_settings, load_params
from pipeline.serving.decoding import STOPPING, DecodingConfig
from pipeline.serving.translator import load_translator
from transformer.checkpoint import CheckpointError

PAPER = "§6.1"


def decoding_defaults(params_file: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """The decoding settings the evaluate stage uses and where each comes from: ``params_file``'s
    ``evaluate`` section, the tune stage's choice for a null beam size or alpha, the paper's
    (§6.1) where there is no params file or no tune report yet. ``ParamsError``: a broken params file."""
    if not params_file.is_file():
        return DecodingConfig().to_dict(), dict.fromkeys(DecodingConfig().to_dict(), PAPER)
    e = load_params(params_file).evaluate
    settings = DecodingConfig.of(e).to_dict()
    section = f"{params_file}'s evaluate section"
    sources = dict.fromkeys(settings, section)
    try:
        chosen = decoding_settings(e)
    except ParamsError:   # no tune report yet: the paper's settings for the null keys
        sources.update({k: PAPER for k in TUNED if getattr(e, k) is None})
        return settings, sources
    for key in TUNED:
        settings[key] = getattr(chosen, key)
        if getattr(chosen, f"{key}_from") == "tune":
            sources[key] = f"{TUNE_REPORT} (tuned on the validation set)"
    return settings, sources


class InputError(ValueError):
    """The input cannot be translated; the message is the one line to print."""


def decode_input(data: bytes, name: str) -> list[str]:
    """The stripped lines of UTF-8 ``data``; ``InputError`` naming the first line (1-based) that is
    not valid UTF-8 (sentencepiece would fail on it with a traceback, or worse, translate
    replacement characters)."""
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise InputError(f"{name}: line {line} is not valid UTF-8") from None
    return [line.strip() for line in text.splitlines()]


def main(argv: list[str] | None = None) -> None:
    try:
        defaults, source = decoding_defaults(PARAMS_FILE)
    except ParamsError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=paths.AVERAGED_MODEL)
    parser.add_argument("--tokenizer", type=Path, default=paths.TOKENIZER_MODEL)
    parser.add_argument("--input", type=Path, help="source file (default: stdin)")
    parser.add_argument("--output", type=Path, help="translation file (default: stdout)")
    parser.add_argument("--beam-size", type=int, default=defaults["beam_size"],
                        help=f"1 = greedy (default: {defaults['beam_size']}, from {source['beam_size']})")
    parser.add_argument("--alpha", type=float, default=defaults["alpha"],
                        help=f"length penalty alpha (default: {defaults['alpha']}, from {source['alpha']})")
    parser.add_argument("--stopping", choices=STOPPING, default=defaults["stopping"],
                        help=f"when beam search stops a sentence: exact (no live hypothesis can beat the finished "
                             f"ones) or fairseq (beam-size hypotheses finished; sooner) (default: "
                             f"{defaults['stopping']}, from {source['stopping']})")
    parser.add_argument("--max-len-b", type=int, default=defaults["max_len_b"],
                        help=f"output length limit: source length + this (default: {defaults['max_len_b']})")
    parser.add_argument("--batch-sentences", type=int, default=defaults["batch_sentences"])
    parser.add_argument("--precision", choices=["fp32", "bf16"], default=defaults["precision"],
                        help="decoding precision (bf16: faster on CPUs with AVX512-BF16/AMX and on GPUs; "
                             f"default: {defaults['precision']})")
    args = parser.parse_args(argv)
    try:
        decoding = DecodingConfig(args.beam_size, args.alpha, args.max_len_b, args.batch_sentences, args.precision,
                                  args.stopping)
    except ValueError as err:   # named as the option that set it: DecodingConfig.max_len_b -> --max-len-b
        message = str(err)
        for name in DecodingConfig.__dataclass_fields__:
            message = message.replace(f"DecodingConfig.{name}", "--" + name.replace("_", "-"))
        parser.error(message)
    try:
        translator = load_translator(args.model, args.tokenizer, decoding)
    except (CheckpointError, ValueError) as err:
        missing = not (args.model.is_file() and args.tokenizer.is_file())
        print(f"error: {err}{' (train a model first: make run)' if missing else ''}", file=sys.stderr)
        sys.exit(2)
    try:
        data = args.input.read_bytes() if args.input else sys.stdin.buffer.read()
        sentences = decode_input(data, str(args.input) if args.input else "<stdin>")
    except (OSError, InputError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    non_empty = [s for s in sentences if s]
    translated = iter(translator.translate(non_empty))
    lines = [next(translated) if s else "" for s in sentences]
    output = "".join(f"{line}\n" for line in lines)
    if args.output:
        from transformer.atomic import write_text
        write_text(args.output, output)
    else:
        sys.stdout.write(output)


if __name__ == "__main__":
    main()
