"""Parallel data on disk: the token ids the tokenizer writes and training reads (§5.1).

A ``TokenStore`` is a folder of numpy arrays (flat token ids plus offsets per side),
read through memory maps so that corpora of millions of pairs (WMT14) stream from disk
without Python lists; ``encode_to_store`` writes one from text with a ``Tokenizer``. Batching them by
token count is ``batching``'s.
"""

from __future__ import annotations

import array
import hashlib
import itertools
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..atomic import file_sha256, fsync_files, replace_dir, umask_mode

if TYPE_CHECKING:
    from ..tokenizer import Tokenizer

SIDES = ("src", "tgt")


class TokenStoreWriter:
    """Append (source ids, target ids) pairs, then ``close()`` to publish the store atomically.

    Memory stays bounded whatever the corpus size: ids go straight to disk, lengths into compact
    arrays (8 bytes a pair and side), and ``close()`` copies the ids into their ``.npy`` files in
    chunks through a memory map.
    """

    COPY_CHUNK = 1 << 24   # ids copied per step when publishing

    def __init__(self, path: str | os.PathLike, vocab_size: int) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent))
        os.chmod(self.tmp, umask_mode(directory=True))
        self.dtype = np.uint16 if vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32
        self.vocab_size = vocab_size
        self.files = {side: open(self.tmp / f"{side}.bin", "wb") for side in SIDES}
        self.lengths: dict[str, array.array] = {side: array.array("q") for side in SIDES}

    def add(self, src: Sequence[int], tgt: Sequence[int]) -> None:
        for side, ids in zip(SIDES, (src, tgt)):
            self.files[side].write(np.asarray(ids, dtype=self.dtype).tobytes())
            self.lengths[side].append(len(ids))

    def add_many(self, src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]]) -> None:
        """Append a chunk of pairs at once (one write per side)."""
        if len(src) != len(tgt):
            raise ValueError(f"add_many: {len(src)} source and {len(tgt)} target sequences")
        for side, seqs in zip(SIDES, (src, tgt)):
            lengths = [len(ids) for ids in seqs]
            flat = np.fromiter(itertools.chain.from_iterable(seqs), dtype=self.dtype, count=sum(lengths))
            self.files[side].write(flat.tobytes())
            self.lengths[side].extend(lengths)

    def close(self) -> TokenStore:
        for side in SIDES:
            self.files[side].close()
            lengths = np.frombuffer(self.lengths[side], dtype=np.int64) if len(self.lengths[side]) else \
                np.zeros(0, dtype=np.int64)
            offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            raw = np.memmap(self.tmp / f"{side}.bin", dtype=self.dtype, mode="r") if offsets[-1] else \
                np.zeros(0, dtype=self.dtype)
            tokens = np.lib.format.open_memmap(self.tmp / f"{side}.tokens.npy", mode="w+", dtype=self.dtype,
                                               shape=(int(offsets[-1]),))
            for start in range(0, len(raw), self.COPY_CHUNK):
                tokens[start:start + self.COPY_CHUNK] = raw[start:start + self.COPY_CHUNK]
            tokens.flush()
            del tokens, raw
            np.save(self.tmp / f"{side}.offsets.npy", offsets)
            (self.tmp / f"{side}.bin").unlink()
        meta = {"size": len(self.lengths["src"]), "vocab_size": self.vocab_size, "dtype": np.dtype(self.dtype).name}
        (self.tmp / "meta.json").write_text(json.dumps(meta))
        for f in self.tmp.iterdir():
            os.chmod(f, umask_mode())
        fsync_files(self.tmp)
        replace_dir(self.tmp, self.path)
        return TokenStore(self.path)

    def abort(self) -> None:
        """Close and delete the unpublished store."""
        for f in self.files.values():
            f.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def write_token_store(path: str | os.PathLike, pairs: Iterable[tuple[Sequence[int], Sequence[int]]],
                      vocab_size: int) -> TokenStore:
    writer = TokenStoreWriter(path, vocab_size)
    try:
        for src, tgt in pairs:
            writer.add(src, tgt)
        return writer.close()
    except BaseException:
        writer.abort()
        raise


class TokenStore:
    """Read-only memory-mapped parallel corpus of token ids (no BOS/EOS stored)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        meta_file = self.path / "meta.json"
        if not meta_file.is_file():
            raise FileNotFoundError(f"{self.path} is not a token store (no meta.json)")
        self.meta = json.loads(meta_file.read_text())
        self.tokens = {s: np.load(self.path / f"{s}.tokens.npy", mmap_mode="r") for s in SIDES}
        self.offsets = {s: np.load(self.path / f"{s}.offsets.npy") for s in SIDES}
        self.lengths = {s: np.diff(self.offsets[s]) for s in SIDES}

    def __len__(self) -> int:
        return int(self.meta["size"])

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    def ids(self, side: str, index: int) -> np.ndarray:
        start, end = self.offsets[side][index], self.offsets[side][index + 1]
        return np.asarray(self.tokens[side][start:end], dtype=np.int64)

    def pair(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        return self.ids("src", index), self.ids("tgt", index)

    def num_tokens(self, side: str = "tgt") -> int:
        return int(self.offsets[side][-1])

    def content_sha256(self) -> str:
        """sha256 of what the store holds (its ids, their offsets and its meta.json): two stores
        with the same sentence lengths but other ids differ here."""
        digest = hashlib.sha256()
        for name in ("meta.json", *(f"{side}.{part}.npy" for side in SIDES for part in ("offsets", "tokens"))):
            digest.update(f"{name}\0{file_sha256(self.path / name)}\n".encode())
        return digest.hexdigest()


def encode_to_store(tokenizer: Tokenizer, src: Iterable[str], tgt: Iterable[str], path: str | os.PathLike,
                    chunk_pairs: int = 20_000, num_threads: int = -1) -> TokenStore:
    """Encode aligned source and target lines into a ``TokenStore`` at ``path``, ``chunk_pairs`` at
    a time with SentencePiece's multithreaded encoder: memory holds one chunk, never a corpus.
    Raises ``ValueError`` if one side has more lines than the other (nothing is published)."""
    writer = TokenStoreWriter(path, tokenizer.vocab_size)
    try:
        src_it, tgt_it = iter(src), iter(tgt)
        while True:
            a = list(itertools.islice(src_it, chunk_pairs))
            b = list(itertools.islice(tgt_it, len(a) if a else 1))
            if len(a) != len(b):
                raise ValueError(f"the source side has {'more' if len(a) > len(b) else 'fewer'} "
                                 "lines than the target side")
            if not a:
                break
            writer.add_many(tokenizer.encode(a, num_threads), tokenizer.encode(b, num_threads))
        return writer.close()
    except BaseException:
        writer.abort()
        raise
