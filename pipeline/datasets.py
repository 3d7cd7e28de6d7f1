"""The registry of parallel corpora, and their download, verification and cleaning into plain text.

Each data set in ``REGISTRY`` names its upstream files (URL relative to a base URL), where the
two language sides of each split live in them (a file, a member of a tar archive, a gzip file
inside a tar, an SGM file) and, where the publisher gives one, the file's sha256.

Trust and integrity
    Every file is verified before it is used. A file with a published sha256 (Multi30k's raw
    files, checked against the local mirror described in shared/data/README.md) is checked
    against it. A file without one (the statmt.org WMT archives, the Multi30k files that are not
    mirrored) is trusted on first use: the sha256 of its first download is recorded in
    ``pipeline/checksums.json`` and every later download or cache hit is checked against it.
    **Commit checksums.json** after the first download of a new file: the record is what makes
    later runs, on other machines and through mirrors, reproducible and tamper-evident. If an
    upstream file really changes, delete its entry and rerun. The file is rewritten atomically.

Mirrors
    ``DATA_MIRROR`` (or ``data.mirror``) replaces the upstream base URL. It may be a local
    directory laid out like upstream (``<mirror>/data/task1/raw/train.en.gz`` for Multi30k,
    ``<mirror>/wmt13/training-parallel-europarl-v7.tgz`` for WMT14), a ``file://`` URL of one,
    or an ``http(s)://`` base URL. A local file is copied into the download cache through a
    temporary file while its sha256 is computed, and only renamed into place when it matches.
    HTTP(S) downloads go through pooch (hash check before the file is moved into the cache,
    ``retry_if_failed`` with a growing wait) with ``pipeline.resumable``'s downloader: an
    interrupted transfer continues with an HTTP Range request, at the next attempt or run, when
    the server allows (progress bar on a terminal).

Output
    ``prepare_corpus`` writes ``train.{src,tgt}``, ``{valid_set}.{src,tgt}``,
    ``{test}.{src,tgt}`` and ``stats.json`` into a temporary directory beside ``out_dir`` and
    renames it over ``out_dir`` only when everything succeeded, so a failed or interrupted run
    (bad hash, misaligned files, invalid UTF-8) leaves the previous output untouched.

Incoming data
    ``data.incoming_dir`` (default ``data/incoming``) may hold new parallel data as pairs of
    plain UTF-8 files ``<name>.<src_lang>`` and ``<name>.<tgt_lang>``, one sentence a line. They
    are appended to the training split after the data set's own corpora, cleaned like them,
    not counted against ``limit_train_pairs``, and pairs whose source sentence is in the
    validation or a test set are dropped (``overlap``) so they cannot leak into the scores that
    decide a promotion. Each file is versioned with its own ``dvc add`` (a ``.dvc`` file beside
    it; the retraining flow does this), so the folder itself can stay in git with a README and a
    fresh clone without incoming data still runs; a ``.dvc`` file whose data is missing is an
    error (``dvc pull``). A missing folder means no incoming data.
"""

from __future__ import annotations

import gzip
import hashlib
import itertools
import json
import os
import re
import shutil
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping

from pipeline.resumable import ResumableDownloader, partial_path
from transformer.checkpoint import file_sha256

if TYPE_CHECKING:  # pipeline.params imports this module; only the type is needed here
    from pipeline.params import DataParams

CHECKSUMS_FILE = Path(__file__).with_name("checksums.json")
DOWNLOAD_RETRIES = 3          # pooch retry_if_failed: waits 1 s, 2 s, 3 s between attempts
DOWNLOAD_TIMEOUT_S = 60       # per request (connect / between bytes), not for the whole file
TRAIN_SPLIT = "train"


class DataError(ValueError):
    """A data set cannot be fetched or prepared; the one-line message names the file (and line)."""


# ----------------------------------------------------------------------------- registry types


@dataclass(frozen=True)
class RemoteFile:
    """One upstream file, ``path`` relative to its data set's base URL (and to any mirror)."""

    path: str
    sha256: str | None = None   # published hash; None = trust on first use (checksums.json)


@dataclass(frozen=True)
class Side:
    """Where one language side of a corpus is: a file, or a member of a tar archive.

    ``fmt`` is how that file or member is read: ``text`` (one sentence a line), ``gz``
    (gzip-compressed text) or ``sgm`` (WMT SGML: one ``<seg>`` a sentence).
    """

    file: RemoteFile
    member: str | None = None
    fmt: str = "text"

    @property
    def label(self) -> str:
        """How error messages name this side: ``archive.tgz:member`` or the file's path."""
        return f"{Path(self.file.path).name}:{self.member}" if self.member else self.file.path


@dataclass(frozen=True)
class Corpus:
    """Line-aligned sides of one parallel corpus; a split concatenates one or more corpora."""

    name: str
    sides: Mapping[str, Side]
    unverified: frozenset[str] = frozenset()   # languages whose upstream file is not confirmed


@dataclass(frozen=True)
class DatasetSpec:
    """A data set: its upstream base URL and, per split, the corpora it is made of."""

    name: str
    description: str
    base_url: str
    cache_name: str            # folder under the download cache (data sets may share one)
    splits: Mapping[str, tuple[Corpus, ...]]

    @property
    def languages(self) -> list[str]:
        """Languages with training data, sorted."""
        return sorted(self.split_languages(TRAIN_SPLIT))

    def split_languages(self, split: str) -> set[str]:
        """Languages that every corpus of ``split`` has a side for."""
        corpora = self.splits.get(split, ())
        if not corpora:
            return set()
        return set.intersection(*(set(c.sides) for c in corpora))

    @property
    def eval_splits(self) -> list[str]:
        """Splits that may serve as validation or test sets."""
        return [s for s in self.splits if s != TRAIN_SPLIT]

    def url(self, file: RemoteFile) -> str:
        """The upstream URL of ``file``; also its key in checksums.json."""
        return self.base_url + file.path


# ----------------------------------------------------------------------------- the data sets

MULTI30K_COMMIT = "a3d2e0d26b56f3846f66a952536ffed4e401d05a"
MULTI30K_BASE_URL = f"https://github.com/multi30k/dataset/raw/{MULTI30K_COMMIT}/"
MULTI30K_RAW = "data/task1/raw/{split}.{lang}.gz"

# Published in shared/data/README.md for the files of the local mirror (byte-identical to
# upstream at MULTI30K_COMMIT). The other Multi30k files have no published hash.
MULTI30K_SHA256: dict[str, str] = {
    "data/task1/raw/test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "data/task1/raw/test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "data/task1/raw/test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
    "data/task1/raw/train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "data/task1/raw/train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "data/task1/raw/train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "data/task1/raw/val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "data/task1/raw/val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "data/task1/raw/val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
}

# Task 1 splits and their languages upstream. The statistics in the upstream README (at the
# pinned commit) list train/val/test_2016_flickr for en, de, fr, cs and test_2017_flickr /
# test_2017_mscoco for en, de, fr. test_2018_flickr was first released with the English source
# side only (references held back for a Codalab evaluation); de/fr/cs files exist in later
# upstream history, but we could not confirm they are in the tree at MULTI30K_COMMIT, so those
# sides are marked unverified (allowed, with a warning; a missing file fails the download).
MULTI30K_SPLITS: dict[str, tuple[str, ...]] = {
    "train": ("en", "de", "fr", "cs"),
    "val": ("en", "de", "fr", "cs"),
    "test_2016_flickr": ("en", "de", "fr", "cs"),
    "test_2017_flickr": ("en", "de", "fr"),
    "test_2017_mscoco": ("en", "de", "fr"),
    "test_2018_flickr": ("en", "de", "fr", "cs"),
}
MULTI30K_UNVERIFIED: dict[str, frozenset[str]] = {"test_2018_flickr": frozenset({"de", "fr", "cs"})}


def multi30k_spec(sha256: Mapping[str, str] = MULTI30K_SHA256, base_url: str = MULTI30K_BASE_URL) -> DatasetSpec:
    """Multi30k task 1 (raw, gzip) at ``MULTI30K_COMMIT``; ``sha256`` maps paths to published hashes."""
    splits = {}
    for split, langs in MULTI30K_SPLITS.items():
        sides = {}
        for lang in langs:
            path = MULTI30K_RAW.format(split=split, lang=lang)
            sides[lang] = Side(RemoteFile(path, sha256.get(path)), fmt="gz")
        splits[split] = (Corpus(split, sides, MULTI30K_UNVERIFIED.get(split, frozenset())),)
    return DatasetSpec(
        name="multi30k",
        description="Multi30k task 1 (Elliott et al. 2016/2017, Barrault et al. 2018), github.com/multi30k/dataset",
        base_url=base_url,
        cache_name=f"multi30k-{MULTI30K_COMMIT[:10]}",
        splits=splits,
    )


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
    train.append(Corpus("news-commentary-v9", in_archive(_NEWS_COMMENTARY, f"training/news-commentary-v9.{pair}.{{lang}}")))
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


REGISTRY: dict[str, DatasetSpec] = {
    "multi30k": multi30k_spec(),
    "wmt14_en_de": wmt14_spec("de"),
    "wmt14_en_fr": wmt14_spec("fr"),
}


def get_spec(name: str) -> DatasetSpec:
    """The registry entry ``name``; ``DataError`` naming the known ones if there is none."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise DataError(f"data.dataset {name!r} is not in the registry (known: {', '.join(REGISTRY)})") from None


# ----------------------------------------------------------------------------- params check


def check_data_params(data: DataParams) -> None:
    """Check ``data`` against the registry; ``ValueError`` whose message starts with the key."""
    spec = REGISTRY.get(data.dataset)
    if spec is None:
        raise ValueError(f"data.dataset {data.dataset!r} is not in the registry (known: {', '.join(REGISTRY)})")
    for key, lang in (("src_lang", data.src_lang), ("tgt_lang", data.tgt_lang)):
        if lang not in spec.languages:
            raise ValueError(f"data.{key} {lang!r} is not a language of {spec.name} (known: {', '.join(spec.languages)})")

    def check_eval(key: str, split: str) -> None:
        if split == TRAIN_SPLIT:
            raise ValueError(f"{key}: {TRAIN_SPLIT} is the training split; choose one of {', '.join(spec.eval_splits)}")
        if split not in spec.splits:
            raise ValueError(f"{key}: {split!r} is not a split of {spec.name} (known: {', '.join(spec.eval_splits)})")
        for lang in (data.src_lang, data.tgt_lang):
            if lang not in spec.split_languages(split):
                raise ValueError(f"{key}: {split} has no {lang} side in {spec.name}")

    check_eval("data.valid_set", data.valid_set)
    seen: set[str] = set()
    for split in data.test_sets:
        if split in seen:
            raise ValueError(f"data.test_sets: {split} is listed twice")
        seen.add(split)
        check_eval("data.test_sets", split)


# ----------------------------------------------------------------------------- checksums


def load_checksums(path: Path | None = None) -> dict[str, str]:
    """Recorded sha256 by upstream URL, from ``path`` (default ``CHECKSUMS_FILE``); {} if absent."""
    path = CHECKSUMS_FILE if path is None else path
    if not path.is_file():
        return {}
    try:
        records = json.loads(path.read_text(encoding="utf-8")).get("sha256", {})
    except (ValueError, AttributeError) as err:
        raise DataError(f"{path} is not a valid checksums file: {err}") from None
    if not isinstance(records, dict):
        raise DataError(f"{path}: 'sha256' must map URLs to hashes")
    return records


def record_checksum(url: str, sha256: str, path: Path | None = None) -> None:
    """Add ``url -> sha256`` to the checksums file, written atomically (temp file + rename)."""
    path = CHECKSUMS_FILE if path is None else path
    records = load_checksums(path)
    records[url] = sha256
    document = {
        "comment": "sha256 of upstream files that publish none, recorded on first download by "
                   "pipeline/datasets.py and checked on every later use. Commit this file.",
        "sha256": dict(sorted(records.items())),
    }
    _write_atomic(path, json.dumps(document, indent=2) + "\n")


def _default_mode(directory: bool = False) -> int:
    """Permissions a plain open()/mkdir() would give (temp files and dirs are created 0600/0700)."""
    mask = os.umask(0)
    os.umask(mask)
    return (0o777 if directory else 0o666) & ~mask


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, _default_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ----------------------------------------------------------------------------- download


def local_mirror(mirror: str) -> Path | None:
    """The directory a mirror names (a path or ``file://`` URL), or None for upstream / http(s)."""
    if not mirror:
        return None
    parsed = urllib.parse.urlparse(mirror)
    scheme = parsed.scheme.lower()
    if scheme in ("http", "https"):
        return None
    if scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise DataError(f"data mirror {mirror!r}: file:// URLs must name a local path")
        path = Path(urllib.request.url2pathname(parsed.path))
    elif len(scheme) > 1:   # one letter: a Windows drive
        raise DataError(f"data mirror {mirror!r}: unsupported scheme {scheme!r} (use a folder, file://, http:// or https://)")
    else:
        path = Path(mirror).expanduser()
    if not path.is_dir():
        raise DataError(f"data mirror {mirror!r} (DATA_MIRROR or data.mirror) is not a directory")
    return path


def _copy_verified(source: Path, target: Path, expected: str | None) -> str:
    """Copy ``source`` to ``target`` through a temp file, renamed only if its sha256 is ``expected``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out, open(source, "rb") as inp:
            for chunk in iter(lambda: inp.read(1 << 20), b""):
                digest.update(chunk)
                out.write(chunk)
        actual = digest.hexdigest()
        if expected and actual != expected:
            raise DataError(f"sha256 mismatch for {source}: expected {expected}, got {actual}; file not used")
        os.chmod(tmp, _default_mode())
        os.replace(tmp, target)
        return actual
    finally:
        Path(tmp).unlink(missing_ok=True)


def fetch_file(
    spec: DatasetSpec,
    file: RemoteFile,
    cache_dir: Path,
    mirror: str = "",
    *,
    checksums_file: Path | None = None,
    retries: int = DOWNLOAD_RETRIES,
    progress: bool | None = None,
    record: bool = True,
) -> tuple[Path, str, str]:
    """A verified copy of ``file`` in ``cache_dir/<spec.cache_name>/<file.path>``.

    The expected sha256 is the published one, else the one recorded in the checksums file;
    with neither, the file is trusted on first use and its hash recorded (unless ``record`` is
    False: ``prepare_corpus`` records only once the file proved readable). Returns the cached
    path, its sha256 and where that hash came from (``published``, ``recorded`` or
    ``first-download``). Any failure (missing file, network error after ``retries`` retries,
    hash mismatch) raises ``DataError`` and leaves no unverified file in the cache.
    """
    url = spec.url(file)
    expected = file.sha256 or load_checksums(checksums_file).get(url)
    origin = "published" if file.sha256 else ("recorded" if expected else "first-download")
    root = cache_dir / spec.cache_name
    target = root / file.path
    mirror_dir = local_mirror(mirror)
    hint = "" if origin != "recorded" else (
        f" (hash recorded in {checksums_file or CHECKSUMS_FILE}; delete the entry if upstream really changed)")
    if mirror_dir is not None:
        source = mirror_dir / file.path
        if expected and target.is_file() and file_sha256(target) == expected:
            actual = expected          # already in the cache, verified
        elif not source.is_file():
            raise DataError(f"data mirror {mirror_dir} has no {file.path}")
        else:
            try:
                actual = _copy_verified(source, target, expected)
            except DataError as err:
                raise DataError(f"{err}{hint}") from None
    else:
        import pooch           # imported here: checking params must not need it
        import requests

        base = mirror.rstrip("/") + "/" if mirror else spec.base_url
        fetcher = pooch.create(path=root, base_url=base, retry_if_failed=retries,
                               registry={file.path: f"sha256:{expected}" if expected else None})
        # Resumes from the bytes an interrupted attempt (or run) received, when the server allows.
        downloader = ResumableDownloader(partial_path(target), DOWNLOAD_TIMEOUT_S,
                                         progress=sys.stderr.isatty() if progress is None else progress)
        try:
            fetcher.fetch(file.path, downloader=downloader)
        except ValueError as err:      # pooch: hash mismatch (download already deleted)
            message = " ".join(str(err).split())
            raise DataError(f"{base}{file.path}: {message}{hint}") from None
        except (requests.RequestException, OSError) as err:
            message = " ".join(str(err).split())
            raise DataError(f"could not download {base}{file.path} after {retries + 1} attempt(s): {message}") from None
        actual = expected or file_sha256(target)
    if expected is None and record:
        record_checksum(url, actual, checksums_file)
    return target, actual, origin


def extract_tar(archive: Path, dest: Path, members: Iterable[str] | None = None) -> Path:
    """Extract ``members`` (all when None) of a tar archive (any compression) into ``dest``.

    Extraction uses tarfile's ``data`` filter, which rejects members that would land outside
    ``dest`` (``../`` paths, links pointing outside, device files). Members are extracted into
    a temporary directory beside ``dest`` in one streaming pass and each is then renamed into
    place, so ``dest`` only ever holds complete files; on any error nothing is moved.
    Member names are matched with any leading ``./`` removed.
    """
    wanted = None if members is None else {_norm_member(m) for m in members}
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.part-"))
    try:
        found: set[str] = set()
        with tarfile.open(archive, "r|*") as tar:
            for member in tar:
                name = _norm_member(member.name)
                if wanted is not None and name not in wanted:
                    continue
                tar.extract(member, tmp, filter="data")
                found.add(name)
        if wanted is not None and wanted - found:
            raise DataError(f"{archive.name} has no member {sorted(wanted - found)[0]}")
        for path in sorted(tmp.rglob("*")):
            if path.is_dir() and not path.is_symlink():
                continue
            target = dest / path.relative_to(tmp)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, target)
    except tarfile.FilterError as err:
        raise DataError(f"{archive.name}: unsafe member rejected: {err}") from None
    except (tarfile.TarError, EOFError, OSError) as err:
        raise DataError(f"{archive.name}: cannot extract: {' '.join(str(err).split())}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _norm_member(name: str) -> str:
    while name.startswith("./"):
        name = name[2:]
    return name


# ----------------------------------------------------------------------------- reading

# Characters str.splitlines() breaks lines at, besides "\n": inside a sentence they would
# misalign any reader that splits lines that way, so they become spaces.
_LINE_BREAKS = re.compile("[\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
_SEG = re.compile(r"<seg\b[^>]*>(.*)</seg>", re.IGNORECASE)


def read_lines(path: Path, fmt: str, label: str) -> Iterator[str]:
    """Sentences of a text / gzip / SGM file, whitespace-stripped, strict UTF-8.

    Lines are split on ``\\n`` only. Raises ``DataError`` naming ``label`` and the line number
    for invalid UTF-8, and for an unreadable or truncated gzip stream.
    """
    opener: Any = gzip.open if fmt == "gz" else open
    lineno = 0
    try:
        with opener(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise DataError(f"{label}: line {lineno} is not valid UTF-8 ({err.reason} at byte {err.start})") from None
                if fmt == "sgm":
                    match = _SEG.search(text)
                    if match is None:
                        continue
                    text = match.group(1)
                yield _LINE_BREAKS.sub(" ", text).strip()
    except (OSError, EOFError) as err:
        raise DataError(f"{label}: cannot read after line {lineno}: {' '.join(str(err).split())}") from None


_END = object()


def read_pairs(src: tuple[Path, Side], tgt: tuple[Path, Side]) -> Iterator[tuple[str, str]]:
    """Aligned (source, target) sentences; ``DataError`` naming both files if the counts differ."""
    a = read_lines(src[0], src[1].fmt, src[1].label)
    b = read_lines(tgt[0], tgt[1].fmt, tgt[1].label)
    count = 0
    for x, y in itertools.zip_longest(a, b, fillvalue=_END):
        if x is _END or y is _END:
            rest = 1 + sum(1 for _ in (a if y is _END else b))
            na, nb = (count + rest, count) if y is _END else (count, count + rest)
            raise DataError(f"misaligned corpus: {src[1].label} has {na} lines but {tgt[1].label} has {nb}")
        count += 1
        yield x, y  # type: ignore[misc]


# ----------------------------------------------------------------------------- prepare


def _clean_reason(src: str, tgt: str, max_words: int, max_ratio: float) -> str | None:
    if not src or not tgt:
        return "empty"
    ns, nt = len(src.split()), len(tgt.split())
    if max(ns, nt) > max_words:
        return "too_long"
    if max(ns, nt) / min(ns, nt) > max_ratio:
        return "ratio"
    return None


def _copy_clean(pairs: Iterable[tuple[str, str]], fs: Any, ft: Any, data: DataParams, dropped: dict[str, int],
                reject: Callable[[str, int], str | None]) -> tuple[int, int]:
    """Write the pairs that pass cleaning (and ``reject(src, kept so far)``) to ``fs``/``ft``;
    count the others in ``dropped`` by reason. Returns (raw pairs, kept pairs)."""
    raw = kept = 0
    for s, t in pairs:
        raw += 1
        reason = _clean_reason(s, t, data.max_words, data.max_ratio) or reject(s, kept)
        if reason is not None:
            dropped[reason] += 1
            continue
        fs.write(s + "\n")
        ft.write(t + "\n")
        kept += 1
    return raw, kept


def _write_train(data: DataParams, corpora: list[tuple[Corpus, tuple[Path, Side], tuple[Path, Side]]],
                 out: Path) -> dict[str, Any]:
    dropped = {"empty": 0, "too_long": 0, "ratio": 0, "limit": 0}
    raw = kept = 0
    per_corpus: dict[str, int] = {}
    with open(out / f"{TRAIN_SPLIT}.{data.src_lang}", "w", encoding="utf-8", newline="\n") as fs, \
            open(out / f"{TRAIN_SPLIT}.{data.tgt_lang}", "w", encoding="utf-8", newline="\n") as ft:
        for corpus, src, tgt in corpora:
            limit = data.limit_train_pairs - kept
            # Past the limit, keep reading: raw counts and alignment cover the whole corpus.
            r, k = _copy_clean(read_pairs(src, tgt), fs, ft, data, dropped,
                               lambda s, done: "limit" if data.limit_train_pairs and done >= limit else None)
            raw, kept = raw + r, kept + k
            per_corpus[corpus.name] = r
    if kept == 0:
        detail = ", ".join(f"{k} {v}" for k, v in dropped.items() if v)
        raise DataError(f"{TRAIN_SPLIT}: no sentence pairs left after cleaning ({raw} raw pairs{'; dropped: ' + detail if detail else ''})")
    return {"raw": raw, "kept": kept, "dropped": dropped, "corpora": per_corpus}


def incoming_pairs(directory: Path, src_lang: str, tgt_lang: str) -> list[tuple[str, Path, Path]]:
    """``(name, source file, target file)`` of each pair in ``directory``, sorted by name.

    Files of other languages, hidden files and README-like files are ignored. A name with only
    one side of the pair, or a ``.dvc`` file whose data file is missing, raises ``DataError``.
    """
    if not directory.is_dir():
        return []
    sides: dict[str, dict[str, Path]] = {}
    for path in sorted(directory.iterdir()):
        if path.name.startswith("."):
            continue
        if path.suffix == ".dvc":
            tracked = path.with_suffix("")
            if not tracked.exists():
                raise DataError(f"{tracked} is versioned by DVC ({path.name}) but missing: run dvc pull")
            continue
        name, dot, lang = path.name.rpartition(".")
        if dot and name and lang in (src_lang, tgt_lang) and path.is_file():
            sides.setdefault(name, {})[lang] = path
    pairs = []
    for name, found in sorted(sides.items()):
        for lang in (src_lang, tgt_lang):
            if lang not in found:
                raise DataError(f"{directory / f'{name}.{lang}'} is missing: incoming data comes in pairs "
                                f"<name>.{src_lang} and <name>.{tgt_lang}")
        pairs.append((name, found[src_lang], found[tgt_lang]))
    return pairs


def _append_incoming(data: DataParams, pairs: list[tuple[str, Path, Path]], out: Path,
                     held_out: set[str]) -> dict[str, Any]:
    """Append the cleaned incoming pairs to ``out``'s training files; per-pair and dropped counts."""
    dropped = {"empty": 0, "too_long": 0, "ratio": 0, "overlap": 0}
    per_pair: dict[str, dict[str, Any]] = {}
    with open(out / f"{TRAIN_SPLIT}.{data.src_lang}", "a", encoding="utf-8", newline="\n") as fs, \
            open(out / f"{TRAIN_SPLIT}.{data.tgt_lang}", "a", encoding="utf-8", newline="\n") as ft:
        for name, src, tgt in pairs:
            sides = ((src, Side(RemoteFile(str(src)))), (tgt, Side(RemoteFile(str(tgt)))))
            raw, kept = _copy_clean(read_pairs(*sides), fs, ft, data, dropped,
                                    lambda s, done: "overlap" if s in held_out else None)
            per_pair[name] = {"raw": raw, "kept": kept, "files": [str(src), str(tgt)],
                              "sha256": [file_sha256(src), file_sha256(tgt)]}
    return {"pairs": per_pair, "raw": sum(p["raw"] for p in per_pair.values()),
            "kept": sum(p["kept"] for p in per_pair.values()), "dropped": dropped}


def _write_eval(data: DataParams, split: str, corpora: list[tuple[Corpus, tuple[Path, Side], tuple[Path, Side]]],
                out: Path) -> dict[str, Any]:
    count = 0
    with open(out / f"{split}.{data.src_lang}", "w", encoding="utf-8", newline="\n") as fs, \
            open(out / f"{split}.{data.tgt_lang}", "w", encoding="utf-8", newline="\n") as ft:
        for _, src, tgt in corpora:
            for number, (s, t) in enumerate(read_pairs(src, tgt), 1):
                for text, side in ((s, src[1]), (t, tgt[1])):
                    if not text:
                        raise DataError(f"{split}: {side.label} sentence {number} is empty (evaluation sets are not filtered)")
                fs.write(s + "\n")
                ft.write(t + "\n")
                count += 1
    if count == 0:
        raise DataError(f"{split}: the evaluation set has no sentences")
    return {"raw": count, "kept": count, "dropped": {"empty": 0, "too_long": 0, "ratio": 0, "limit": 0}}


def _replace_dir(tmp: Path, out_dir: Path) -> None:
    """Put ``tmp`` at ``out_dir``: rename the old one aside, rename ``tmp`` in, delete the old one."""
    old = None
    if out_dir.exists() or out_dir.is_symlink():
        old = out_dir.with_name(f".{out_dir.name}.old-{uuid.uuid4().hex[:8]}")
        os.rename(out_dir, old)
    try:
        os.rename(tmp, out_dir)
    except BaseException:
        if old is not None:
            os.rename(old, out_dir)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def prepare_corpus(
    data: DataParams,
    out_dir: Path,
    cache_dir: Path,
    *,
    checksums_file: Path | None = None,
    retries: int = DOWNLOAD_RETRIES,
    progress: bool | None = None,
) -> dict[str, Any]:
    """Fetch, verify and clean ``data.dataset`` into plain UTF-8 text files in ``out_dir``.

    Writes ``train.{src,tgt}`` (cleaned: stripped; pairs with an empty side, a side over
    ``max_words`` words or a word-count ratio over ``max_ratio`` dropped; the first
    ``limit_train_pairs`` kept when > 0; then the pairs of ``data.incoming_dir``, see the
    module docstring), ``{valid_set}.{src,tgt}`` and ``{test}.{src,tgt}``
    (whole, unfiltered; an empty line is an error) and ``stats.json``, whose content is also
    returned. Everything is written into a temporary directory beside ``out_dir`` that
    replaces it only at the end. Downloads are verified (see the module docstring) before
    they are read. Raises ``DataError`` with a one-line message on any data problem.
    """
    spec = get_spec(data.dataset)
    try:
        check_data_params(data)
    except ValueError as err:
        raise DataError(str(err)) from None
    src_lang, tgt_lang = data.src_lang, data.tgt_lang
    splits = [TRAIN_SPLIT, data.valid_set] + [s for s in data.test_sets if s != data.valid_set]
    mirror = data.resolved_mirror()
    incoming_dir = Path(data.incoming_dir) if data.incoming_dir else None
    incoming = incoming_pairs(incoming_dir, src_lang, tgt_lang) if incoming_dir else []

    # 1. fetch and verify every file the splits need (archives once, however many members)
    needed: dict[RemoteFile, set[str]] = {}
    for split in splits:
        for corpus in spec.splits[split]:
            for lang in (src_lang, tgt_lang):
                if lang in corpus.unverified:
                    print(f"warning: {spec.name} {split} {lang}: this side is not confirmed upstream; "
                          "if its download fails, choose another split", file=sys.stderr)
                side = corpus.sides[lang]
                needed.setdefault(side.file, set())
                if side.member:
                    needed[side.file].add(side.member)
    local: dict[tuple[RemoteFile, str | None], Path] = {}
    sources = []
    for file, members in needed.items():
        path, digest, origin = fetch_file(spec, file, cache_dir, mirror, checksums_file=checksums_file,
                                          retries=retries, progress=progress, record=False)
        sources.append({"url": spec.url(file), "sha256": digest, "hash": origin})
        local[(file, None)] = path
        if members:
            dest = cache_dir / spec.cache_name / "extracted" / f"{file.path}.{digest[:12]}"
            missing = [m for m in sorted(members) if not (dest / m).is_file()]
            if missing:
                extract_tar(path, dest, missing)
            for member in members:
                local[(file, member)] = dest / member

    def located(side: Side) -> tuple[Path, Side]:
        return local[(side.file, side.member)], side

    # 2. read, check and write into a temporary directory beside out_dir
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.tmp-"))
    os.chmod(tmp, _default_mode(directory=True))
    try:
        split_stats: dict[str, Any] = {}
        for split in splits:
            corpora = [(c, located(c.sides[src_lang]), located(c.sides[tgt_lang])) for c in spec.splits[split]]
            if split == TRAIN_SPLIT:
                stats = _write_train(data, corpora, tmp)
            else:
                stats = _write_eval(data, split, corpora, tmp)
            stats["files"] = [f"{split}.{src_lang}", f"{split}.{tgt_lang}"]
            split_stats[split] = stats
        incoming_stats = None
        if incoming:
            held_out = {line for split in splits[1:]
                        for line in (tmp / f"{split}.{src_lang}").read_text(encoding="utf-8").split("\n")}
            incoming_stats = _append_incoming(data, incoming, tmp, held_out)
            train = split_stats[TRAIN_SPLIT]
            train["raw"] += incoming_stats["raw"]
            train["kept"] += incoming_stats["kept"]
            for reason, count in incoming_stats["dropped"].items():
                train["dropped"][reason] = train["dropped"].get(reason, 0) + count
            for name, pair in incoming_stats["pairs"].items():
                train["corpora"][f"incoming/{name}"] = pair["raw"]
        result = {
            "dataset": spec.name,
            "src_lang": src_lang,
            "tgt_lang": tgt_lang,
            "valid_set": data.valid_set,
            "test_sets": list(data.test_sets),
            "cleaning": {"max_words": data.max_words, "max_ratio": data.max_ratio,
                         "limit_train_pairs": data.limit_train_pairs},
            "splits": split_stats,
            "sources": sources,
            "incoming": {"dir": data.incoming_dir, **(incoming_stats or {"pairs": {}, "raw": 0, "kept": 0})},
        }
        (tmp / "stats.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        _replace_dir(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    # Trust on first use, recorded only now: a download that turned out truncated or unreadable
    # (a broken archive, misaligned files) must not become the reference for every later run.
    for source in sources:
        if source["hash"] == "first-download":
            record_checksum(source["url"], source["sha256"], checksums_file)
    return result
