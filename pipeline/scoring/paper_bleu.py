"""BLEU as the paper measured it: tokenized, compounds split, multi-bleu.perl (§6.1, Table 2).

Vaswani et al. report WMT14 scores from tensor2tensor's ``utils/get_ende_bleu.sh``:

1. ``tokenizer.perl -l de`` (Moses) on the hypotheses; the reference ``newstest2014.tok.de`` was
   tokenized by the same script (Google's wmt16_en_de.sh data preparation);
2. compound splitting on both: ``perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'`` (as GNMT and
   ConvS2S reported: "rich-text" -> "rich ##AT##-##AT## text");
3. ``multi-bleu.perl`` (cased, one reference, no smoothing) on the results.

Here: sacremoses' port of tokenizer.perl with the script's defaults (no ``-a`` aggressive hyphen
splitting; escaping on, as ``tokenizer.perl`` does unless ``-no-escape``: ``&`` -> ``&amp;`` and so
on), the same substitution with Perl's byte semantics for ``\\S`` (``re.ASCII``), and sacrebleu's
BLEU with ``tokenize="none"`` and ``smooth_method="none"``, which counts exactly what multi-bleu.perl
counts: whitespace-split tokens, clipped n-gram matches up to 4, brevity penalty
``exp(1 - r/c)`` when ``c < r``, and 0 when any n-gram order has no match.

Known differences from the Perl pipeline, none of which changes a score on ordinary text:
escaping maps one token to one token and keeps every character non-blank, so it cannot change a
match or the compound regex (it is kept only to mirror the script); sacremoses tracks
tokenizer.perl (v1.1 era) but is a port, so rare inputs may tokenize differently; multi-bleu.perl
splits on ASCII whitespace and sacrebleu on Unicode whitespace, which only matters if a token
still holds a Unicode space after tokenization (the tokenizer turns them into spaces).

This score is higher than sacreBLEU's detokenized one (the 13a tokenizer keeps hyphenated words
whole, and the split adds easy ``##AT##`` matches); the evaluate stage reports it beside sacreBLEU
for WMT data sets only, so our numbers can be set next to the paper's 27.3 / 28.4 (EN-DE).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import sacrebleu
from sacrebleu.metrics.bleu import BLEUScore

from pipeline.text.moses import moses_tokenize

# get_ende_bleu.sh's substitution; Perl without -C reads bytes, so \S is "not ASCII whitespace".
_COMPOUND = re.compile(r"(\S)-(\S)", re.ASCII)


@dataclass(frozen=True)
class PaperBleu:
    """A tokenized, compound-split BLEU score and the statistics multi-bleu.perl prints with it."""

    score: float              # 0-100, unrounded
    description: str          # what was done, with versions: report it beside the score
    counts: tuple[int, ...]   # matched 1..4-grams (clipped)
    totals: tuple[int, ...]   # hypothesis 1..4-grams
    bp: float                 # brevity penalty
    sys_len: int              # hypothesis tokens, after tokenization and splitting
    ref_len: int              # reference tokens, after tokenization and splitting

    def __str__(self) -> str:
        """multi-bleu.perl's output line, then the description."""
        precisions = "/".join(f"{100 * c / t:.1f}" if t else "0.0" for c, t in zip(self.counts, self.totals))
        ratio = self.sys_len / self.ref_len if self.ref_len else 0.0
        return (f"BLEU = {self.score:.2f}, {precisions} (BP={self.bp:.3f}, ratio={ratio:.3f}, "
                f"hyp_len={self.sys_len}, ref_len={self.ref_len}) [{self.description}]")


def split_compounds(line: str) -> str:
    """``s{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g``: a hyphen between two non-blanks becomes its own
    ``##AT##-##AT##`` token. Matches do not overlap, as in Perl: ``a-b-c`` -> ``a ##AT##-##AT## b-c``
    (but ``Mercedes-Benz-Aktie`` -> ``Mercedes ##AT##-##AT## Benz ##AT##-##AT## Aktie``)."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", line)


def multi_bleu(hypotheses: list[str], references: list[str]) -> BLEUScore:
    """multi-bleu.perl on already tokenized text: whitespace tokens, cased, no smoothing."""
    return sacrebleu.corpus_bleu(hypotheses, [references], smooth_method="none", tokenize="none",
                                 lowercase=False, force=True)


def describe(lang: str) -> str:
    """The one-line account of what ``bleu_tok_compound_split`` does, with library versions."""
    return (f"tokenized (Moses tokenizer.perl -l {lang} via sacremoses {importlib.metadata.version('sacremoses')}, "
            f"escape on, no -a) + compound splitting ##AT## (tensor2tensor get_ende_bleu.sh), "
            f"BLEU as multi-bleu.perl (sacrebleu {sacrebleu.__version__} tokenize=none, smooth=none, cased)")


def bleu_tok_compound_split(hypotheses: list[str], references: list[str], lang: str) -> PaperBleu:
    """Corpus BLEU of detokenized ``hypotheses`` against detokenized ``references`` in ``lang``,
    measured as the paper did (see the module docstring).

    Raises ``ValueError`` when the two lists differ in length or are empty.
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"paper BLEU: {len(hypotheses)} hypotheses but {len(references)} references")
    if not references:
        raise ValueError("paper BLEU: no sentences to score")
    hyps = [split_compounds(h) for h in moses_tokenize(hypotheses, lang)]
    refs = [split_compounds(r) for r in moses_tokenize(references, lang)]
    b = multi_bleu(hyps, refs)
    return PaperBleu(score=float(b.score), description=describe(lang), counts=tuple(b.counts),
                     totals=tuple(b.totals), bp=float(b.bp), sys_len=int(b.sys_len), ref_len=int(b.ref_len))


def main(argv: list[str] | None = None) -> int:
    """``python -m pipeline.scoring.paper_bleu HYPOTHESES REFERENCES [--lang de]``: one sentence a line."""
    parser = argparse.ArgumentParser(prog="python -m pipeline.scoring.paper_bleu", description=__doc__.split("\n")[0])
    parser.add_argument("hypotheses", type=Path)
    parser.add_argument("references", type=Path)
    parser.add_argument("--lang", default="de", help="language of both files (default de)")
    args = parser.parse_args(argv)

    def read(path: Path) -> list[str]:
        return path.read_text(encoding="utf-8").rstrip("\n").split("\n")

    try:
        print(bleu_tok_compound_split(read(args.hypotheses), read(args.references), args.lang))
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
