"""Translate text with the trained (averaged) model: one sentence a line, from stdin or files.

    echo "A man is riding a bike." | python -m pipeline.serving.translate
    python -m pipeline.serving.translate --input news.en --output news.de --beam-size 5 --alpha 1.0
    python -m pipeline.serving.translate --engine ctranslate2 --compute-type int8 --stopping fairseq

Decoding settings default to what the test scores used: params.yaml's ``evaluate`` section, with
the tune stage's choice on the validation set (``reports/tune.json``) for a beam size, alpha,
stopping rule, engine or compute type left null there; the paper's (§6.1, our search) where neither
says: with a warning while the tune stage has not run; a tune report that holds no valid choice is an
error (never silently the paper's). Engine ctranslate2 decodes the export stage's model (``--ct2-model``)
and falls back to torch with a one-line warning where CTranslate2 cannot load it. Input is UTF-8 (a
leading byte-order mark is dropped); a line that is not valid UTF-8 is an error naming its line
number, and nothing is written.
"""

from __future__ import annotations

import argparse
import codecs
import sys
from pathlib import Path
from typing import Any

from pipeline.config import paths
from pipeline.config.decoding import RULES, TUNED, DecodingConfig
from pipeline.config.errors import ParamsError, TuneReportMissing
from pipeline.config.loader import PARAMS
from pipeline.config.params import load_params
from pipeline.serving.decoding import TUNE_REPORT, decoding_settings
from pipeline.serving.engine import load_engine_translator
from transformer.checkpoint import CheckpointError

PAPER = "§6.1"
NO_REPORT = f"the paper ({PAPER}): no tune report yet"   # the source of a null setting before tune ran


def decoding_defaults(params_file: Path, tune_report: Path = TUNE_REPORT,
                      engine: str | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """The decoding settings the evaluate stage uses and where each comes from: ``params_file``'s
    ``evaluate`` section, the tune stage's choice for a null beam size, alpha, stopping rule, engine
    or compute type; the paper's (§6.1) where there is no params file, or for those null ones while
    there is no tune report yet (their source is then ``NO_REPORT``). ``engine`` (``--engine``)
    replaces the section's: the tune stage's choice is then that engine's own (its alpha is its own
    penalty). ``ParamsError``: a broken params file or a tune report that holds no valid choice."""
    if not params_file.is_file():
        paper = DecodingConfig.of({"engine": engine})
        return paper.to_dict(), dict.fromkeys(paper.to_dict(), PAPER)
    e = load_params(params_file).evaluate
    if engine is not None and engine != e.engine:
        e = e.model_copy(update={"engine": engine, "compute_type": None})
    settings = DecodingConfig.of(e).to_dict()
    section = f"{params_file}'s evaluate section"
    sources = dict.fromkeys(settings, section)
    try:
        chosen = decoding_settings(e, tune_report)
    except TuneReportMissing:   # the paper's settings for the null keys; a corrupt report is an error
        sources.update({k: NO_REPORT for k in TUNED if getattr(e, k) is None})
        return settings, sources
    for key in TUNED:
        if getattr(chosen, key) is None:   # no compute type: the engine is torch
            continue
        settings[key] = getattr(chosen, key)
        if getattr(chosen, f"{key}_from") == "tune":
            sources[key] = f"{tune_report} (tuned on the validation set)"
    return settings, sources


def option(name: str) -> str:
    """The command-line option of a decoding setting: max_len_b -> --max-len-b."""
    return "--" + name.replace("_", "-")


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
        defaults, source = decoding_defaults(PARAMS)
    except ParamsError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=paths.AVERAGED_MODEL)
    parser.add_argument("--tokenizer", type=Path, default=paths.TOKENIZER_MODEL)
    parser.add_argument("--ct2-model", type=Path, default=paths.CT2_MODEL,
                        help="the CTranslate2 model of --model (engine ctranslate2; the export stage's)")
    parser.add_argument("--input", type=Path, help="source file (default: stdin)")
    parser.add_argument("--output", type=Path, help="translation file (default: stdout)")
    for name, rule in RULES.items():   # one option per decoding setting, checked by DecodingConfig below
        parser.add_argument(option(name), dest=name, type=rule.kind, choices=rule.choices or None,
                            help=f"{rule.help} (default: {defaults[name]}, from {source[name]})")
    args = parser.parse_args(argv)
    if args.engine is not None and args.engine != defaults["engine"]:
        try:   # the other engine's own tuned settings (its alpha is its own penalty), not these
            defaults, source = decoding_defaults(PARAMS, engine=args.engine)
        except ParamsError as err:
            parser.error(str(err))
    given = {name: getattr(args, name) for name in RULES if getattr(args, name) is not None}
    fallback = [name for name in TUNED if name not in given and source[name] == NO_REPORT
                and not (name == "compute_type" and given.get("engine", defaults["engine"]) == "torch")]
    if fallback:
        print(f"warning: {TUNE_REPORT} does not exist (the tune stage has not run): translating with the paper's "
              f"{', '.join(f'{k} {defaults[k]}' for k in fallback)} ({PAPER}), not settings chosen on the "
              "validation set", file=sys.stderr)
    try:
        decoding = DecodingConfig(**{**defaults, **given})
    except ValueError as err:   # named as the option that set it: DecodingConfig.max_len_b -> --max-len-b
        message = str(err)
        for name in RULES:
            message = message.replace(f"DecodingConfig.{name}", option(name))
        parser.error(message)
    try:
        translator = load_engine_translator(args.model, args.tokenizer, decoding, ct2_model=args.ct2_model)
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
    # A reader's text: detokenized where the model writes the literature's tokenized form.
    translated = iter(translator.tokenizer.for_reader(translator.translate(non_empty)))
    lines = [next(translated) if s else "" for s in sentences]
    output = "".join(f"{line}\n" for line in lines)
    if args.output:
        from transformer.atomic import write_text
        write_text(args.output, output)
    else:
        sys.stdout.write(output)


if __name__ == "__main__":
    main()
