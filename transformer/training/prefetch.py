"""Batches made ready on a background thread while the device trains on the last ones.

The training loop's batches are a pure function of the data position (``TokenBatchSampler``), so a
thread can collate the next updates ahead, in the same order, without changing what is trained:
the outputs are those of a loop that collates in line. On CUDA the thread also pins the batches'
host memory, so the loop's copies to the device are asynchronous (``Batch.to`` is non-blocking).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

Item = TypeVar("Item")
Prepared = TypeVar("Prepared")

_END = object()


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class Prefetcher(Generic[Item, Prepared]):
    """Iterate over ``(item, prepare(item))`` for the items of ``items``, in order, with up to
    ``depth`` of them prepared ahead on one background thread (``depth`` 0: in line, no thread).

    An exception raised by ``items`` or ``prepare`` is raised by ``next`` at the item where it
    happened. ``close`` (or leaving a ``with`` block) stops the thread; items prepared ahead and never
    asked for are dropped.
    """

    def __init__(self, items: Iterator[Item], prepare: Callable[[Item], Prepared], depth: int = 2) -> None:
        self.items, self.prepare, self.depth = items, prepare, depth
        self._stop = threading.Event()
        self._queue: queue.Queue = queue.Queue(maxsize=max(depth, 1))
        self._thread: threading.Thread | None = None
        if depth > 0:
            self._thread = threading.Thread(target=self._fill, name="batch-prefetch", daemon=True)
            self._thread.start()

    def _put(self, entry: object) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _fill(self) -> None:
        try:
            for item in self.items:
                if not self._put((item, self.prepare(item))):
                    return
        except BaseException as error:   # handed to the consumer, raised there
            self._put(_Failure(error))
            return
        self._put(_END)

    def __iter__(self) -> Prefetcher[Item, Prepared]:
        return self

    def __next__(self) -> tuple[Item, Prepared]:
        if self._thread is None:
            item = next(self.items)
            return item, self.prepare(item)
        entry = self._queue.get()
        if entry is _END:
            raise StopIteration
        if isinstance(entry, _Failure):
            raise entry.error
        return entry

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> Prefetcher[Item, Prepared]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
