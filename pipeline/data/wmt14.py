"""WMT 2014 English-German and English-French: the paper's data sets (§5.1)."""

from __future__ import annotations

from pipeline.data.spec import TRAIN_SPLIT, Corpus, DatasetSpec, RemoteFile, Side

STATMT_BASE_URL = "http://www.statmt.org/"
_EUROPARL = RemoteFile("wmt13/training-parallel-europarl-v7.tgz")
_COMMONCRAWL = RemoteFile("wmt13/training-parallel-commoncrawl.tgz")
_UN = RemoteFile("wmt13/training-parallel-un.tgz")
_NEWS_COMMENTARY = RemoteFile("wmt14/training-parallel-nc-v9.tgz")
_GIGA_FREN = RemoteFile("wmt10/training-giga-fren.tar")
_DEV = RemoteFile("wmt14/dev.tgz")
_TEST = RemoteFile("wmt14/test-full.tgz")


def wmt14_spec(other: str) -> DatasetSpec:
    """WMT 2014 English-German (``other="de"``) or English-French (``"fr"``) as in Vaswani et al. 2017.

    Training data: Europarl v7, Common Crawl, News Commentary v9 (en-de: ~4.5M pairs), plus the
    UN corpus and the 10^9 French-English corpus for en-fr (~36M pairs); newstest2013 for
    validation, newstest2014 (the full 3003-sentence set, SGM) for test. The member paths are
    those of the statmt.org archives (as used by e.g. fairseq's prepare-wmt14 scripts).
    statmt.org publishes no checksums: hashes are recorded on first download.
    """
    if other not in ("de", "fr"):
        raise ValueError(f"wmt14_spec: other must be de or fr, got {other!r}")
    pair = f"{other}-en"
    langs = ("en", other)

    def in_archive(file: RemoteFile, pattern: str, fmt: str = "text") -> dict[str, Side]:
        return {lang: Side(file, pattern.format(lang=lang), fmt) for lang in langs}

    train = [
        Corpus("europarl-v7", in_archive(_EUROPARL, f"training/europarl-v7.{pair}.{{lang}}")),
        Corpus("commoncrawl", in_archive(_COMMONCRAWL, f"commoncrawl.{pair}.{{lang}}")),
    ]
    if other == "fr":
        train.append(Corpus("un", in_archive(_UN, "un/undoc.2000.fr-en.{lang}")))
    train.append(Corpus("news-commentary-v9",
                        in_archive(_NEWS_COMMENTARY, f"training/news-commentary-v9.{pair}.{{lang}}")))
    if other == "fr":
        train.append(Corpus("giga-fren", in_archive(_GIGA_FREN, "giga-fren.release2.fixed.{lang}.gz", "gz")))
    # newstest2014 "full": the en side is the source file of the en->xx direction, the other side
    # its reference (the same 3003 segments, in the same order, serve both directions).
    test = Corpus("newstest2014", {
        "en": Side(_TEST, f"test-full/newstest2014-{other}en-src.en.sgm", "sgm"),
        other: Side(_TEST, f"test-full/newstest2014-{other}en-ref.{other}.sgm", "sgm"),
    })
    return DatasetSpec(
        name=f"wmt14_en_{other}",
        description=f"WMT 2014 English-{'German' if other == 'de' else 'French'} (statmt.org)",
        base_url=STATMT_BASE_URL,
        cache_name="statmt",
        splits={
            TRAIN_SPLIT: tuple(train),
            "newstest2013": (Corpus("newstest2013", in_archive(_DEV, "dev/newstest2013.{lang}")),),
            "newstest2014": (test,),
        },
    )


WMT14_EN_DE = wmt14_spec("de")
WMT14_EN_FR = wmt14_spec("fr")
