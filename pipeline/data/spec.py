"""The types of the data registry: where each language side of each split of a data set lives upstream."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

TRAIN_SPLIT = "train"


class DataError(ValueError):
    """A data set cannot be fetched or prepared; the one-line message names the file (and line)."""


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

    def members(self) -> dict[str, set[str]]:
        """Archive members this data set reads, by archive path (for checks against real archives)."""
        found: dict[str, set[str]] = {}
        for corpora in self.splits.values():
            for corpus in corpora:
                for side in corpus.sides.values():
                    if side.member:
                        found.setdefault(side.file.path, set()).add(side.member)
        return found
