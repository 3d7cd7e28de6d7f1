"""Batches by token count (§5.1): pairs of similar length grouped into batches of at most
``max_tokens`` padded tokens, shuffled reproducibly from a seed and an epoch; each update's
batches in the order training takes them; a batch padded into tensors.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from ..tokens import BOS_ID, EOS_ID, PAD_ID
from .token_store import TokenStore


@dataclass
class Batch:
    """A padded training batch.

    src: (B, S) source ids followed by EOS; tgt_in: (B, T) BOS + target; tgt_out: (B, T) target + EOS.
    """

    src: Tensor
    tgt_in: Tensor
    tgt_out: Tensor
    # Target tokens (EOS included, padding not): counted where the batch is built, on the host, so
    # the training loop never reads it back from the device (``collate`` passes it in).
    n_target_tokens: int = -1

    def __post_init__(self) -> None:
        if self.n_target_tokens < 0:
            self.n_target_tokens = int(self.tgt_out.ne(PAD_ID).sum())

    def pin_memory(self) -> Batch:
        """The batch in page-locked host memory, for asynchronous copies to a GPU."""
        return Batch(*(t.pin_memory() for t in (self.src, self.tgt_in, self.tgt_out)),
                     n_target_tokens=self.n_target_tokens)

    def to(self, device: torch.device | str) -> Batch:
        return Batch(*(t.to(device, non_blocking=True) for t in (self.src, self.tgt_in, self.tgt_out)),
                     n_target_tokens=self.n_target_tokens)


def _padded(tokens: np.ndarray, starts: np.ndarray, lengths: np.ndarray, pad_multiple: int,
            bos: bool, eos: bool) -> Tensor:
    """Rows of ``tokens[start:start + length]``, with BOS before and/or EOS after, padded with PAD_ID
    to the longest row rounded up to ``pad_multiple``: a few array operations for the whole batch,
    not a Python loop per sentence (a 25000-token batch in well under a millisecond)."""
    first = int(bos)
    width = int(lengths.max(initial=0)) + first + int(eos)
    width = -(-width // pad_multiple) * pad_multiple
    out = np.full((len(starts), width), PAD_ID, dtype=np.int64)
    column = np.arange(width)[None, :] - first           # the sentence's token each column holds
    inside = (column >= 0) & (column < lengths[:, None])
    out[inside] = tokens[(starts[:, None] + column)[inside]]
    if bos:
        out[:, 0] = BOS_ID
    if eos:
        out[np.arange(len(starts)), lengths + first] = EOS_ID
    return torch.from_numpy(out)


def collate(store: TokenStore, indices: Sequence[int], pad_multiple: int = 1) -> Batch:
    """Build a ``Batch`` of the given pairs; lengths are padded up to a multiple of ``pad_multiple``."""
    idx = np.asarray(indices, dtype=np.int64)
    src_starts, src_lengths = store.offsets["src"][idx], store.lengths["src"][idx]
    tgt_starts, tgt_lengths = store.offsets["tgt"][idx], store.lengths["tgt"][idx]
    src = _padded(store.tokens["src"], src_starts, src_lengths, pad_multiple, bos=False, eos=True)
    tgt_in = _padded(store.tokens["tgt"], tgt_starts, tgt_lengths, pad_multiple, bos=True, eos=False)
    tgt_out = _padded(store.tokens["tgt"], tgt_starts, tgt_lengths, pad_multiple, bos=False, eos=True)
    return Batch(src, tgt_in, tgt_out, n_target_tokens=int(tgt_lengths.sum()) + len(idx))


class TokenBatchSampler:
    """Batches of pairs with similar lengths, each holding at most ``max_tokens`` padded
    tokens on its longer side (the paper: ~25000 source and target tokens per batch, §5.1).

    Pairs are sorted by length with a seeded random tie-break, cut into batches, and the
    batch order is shuffled (padding: see ``padding_fraction``); everything is a function of
    (seed, epoch), so a run can resume at batch i of epoch e exactly. With ``world_size`` > 1 each rank takes every
    world_size-th batch (DistributedSampler's convention).
    """

    def __init__(self, src_lengths: np.ndarray, tgt_lengths: np.ndarray, max_tokens: int, *,
                 seed: int = 0, shuffle: bool = True, rank: int = 0, world_size: int = 1,
                 max_positions: int | None = None, pad_multiple: int = 1) -> None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be positive, got {max_tokens}")
        # +1 for the EOS/BOS each side gains in ``collate``.
        self.src_lengths = np.asarray(src_lengths) + 1
        self.tgt_lengths = np.asarray(tgt_lengths) + 1
        self.max_tokens, self.seed, self.shuffle = max_tokens, seed, shuffle
        self.rank, self.world_size, self.pad_multiple = rank, world_size, pad_multiple
        longest = np.maximum(self.src_lengths, self.tgt_lengths)
        # The width a pair forces on its batch once ``collate`` pads to ``pad_multiple``.
        self.widths = -(-longest // pad_multiple) * pad_multiple
        keep = self.widths <= max_tokens
        if max_positions is not None:
            keep &= longest <= max_positions
        self.indices = np.nonzero(keep)[0]
        # Pairs too long for one batch (or for the model's positions): never trained on. The
        # Trainer reports their number (a log line, and in the metrics ``train()`` returns).
        self.skipped = int((~keep).sum())

    def batches(self, epoch: int) -> list[np.ndarray]:
        """All batches of ``epoch`` for this rank, in training order."""
        batches = self.all_batches(epoch)
        if self.world_size > 1:
            usable = len(batches) - len(batches) % self.world_size
            batches = batches[self.rank:usable:self.world_size]
        return batches

    def all_batches(self, epoch: int) -> list[np.ndarray]:
        """The batches of ``epoch`` for all ranks together, in training order (rank r takes every
        world_size-th of them from the r-th on, and the last ``len % world_size`` none)."""
        rng = np.random.default_rng([self.seed, epoch])
        idx = self.indices
        if self.shuffle:
            idx = idx[rng.permutation(len(idx))]
        # By target length, then source length, ascending and descending in turn from one target
        # length to the next, so a batch that spans two target lengths also spans few source
        # lengths (Multi30k: 4.7% padding against 6.5% with source lengths always ascending).
        tgt = self.tgt_lengths[idx]
        src = np.where(tgt % 2 == 0, self.src_lengths[idx], -self.src_lengths[idx])
        idx = idx[np.lexsort((src, tgt))]
        longest = self.widths[idx]
        batches, start, width = [], 0, 0
        for i, length in enumerate(longest):
            width = max(width, int(length))
            if width * (i + 1 - start) > self.max_tokens:
                batches.append(idx[start:i])
                start, width = i, int(length)
        if start < len(idx):
            batches.append(idx[start:])
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def require_updates(self, update_freq: int, epoch: int = 0) -> None:
        """``ValueError`` naming the knobs when ``epoch`` has fewer batches than one update takes
        (``update_freq`` on each of ``world_size`` processes): a training limited by updates alone
        would otherwise run through empty epochs forever."""
        needed = update_freq * self.world_size
        # A batch holds at most max_tokens padded tokens and a pair needs at least its own width:
        # that many tokens guarantee that many batches, without cutting the epoch (millions of pairs).
        if int(self.widths[self.indices].sum()) >= self.max_tokens * needed:
            return
        batches = len(self.all_batches(epoch))
        if batches >= needed:
            return
        raise ValueError(
            f"an epoch of the training data yields no update: {len(self.widths):,} pairs ({self.skipped:,} "
            f"skipped as longer than TrainConfig.max_tokens or the model's max_positions) make {batches} "
            f"batch(es) of at most TrainConfig.max_tokens={self.max_tokens} tokens, and an update takes "
            f"TrainConfig.update_freq={update_freq} x {self.world_size} process(es) = {needed}: lower "
            "TrainConfig.max_tokens or TrainConfig.update_freq, train with fewer processes, or on more pairs "
            "(the pipeline's data.limit_train_pairs)")

    def padding_fraction(self, epoch: int = 0) -> float:
        """Pad tokens / all tokens of both sides (with BOS/EOS, padded as ``collate`` pads) over
        ``epoch``'s batches."""
        pad = real = 0
        for batch in self.batches(epoch):
            for lengths in (self.src_lengths[batch], self.tgt_lengths[batch]):
                width = -(-int(lengths.max()) // self.pad_multiple) * self.pad_multiple
                pad += width * len(batch) - int(lengths.sum())
                real += int(lengths.sum())
        return pad / (pad + real) if real else 0.0

    def __iter__(self) -> Iterator[np.ndarray]:
        return iter(self.batches(0))


class DataPosition(NamedTuple):
    """An update's batches (``group``: index arrays; None at an epoch's end) and the data position
    after it, which the loop takes on when it trains them (a checkpoint saves it)."""

    group: list | None
    epoch: int
    batch_in_epoch: int


def update_positions(sampler: TokenBatchSampler, update_freq: int, epoch: int,
                     batch_in_epoch: int) -> Iterator[DataPosition]:
    """From the data position (``epoch``, ``batch_in_epoch``) on: each update's batches (index
    arrays) with the position after it, and ``None`` at each epoch's end with the next epoch's
    start. A pure function of the position, so a thread may run it ahead (``prefetch``)."""
    while True:
        batches = sampler.batches(epoch)
        usable = len(batches) - len(batches) % update_freq
        if not usable:   # batch counts vary a little from epoch to epoch: checked again here
            sampler.require_updates(update_freq, epoch)
        while batch_in_epoch < usable:
            group = batches[batch_in_epoch:batch_in_epoch + update_freq]
            batch_in_epoch += update_freq
            yield DataPosition(group, epoch, batch_in_epoch)
        epoch, batch_in_epoch = epoch + 1, 0
        yield DataPosition(None, epoch, 0)   # epoch boundary
