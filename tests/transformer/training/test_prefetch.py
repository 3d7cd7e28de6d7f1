"""transformer/training/prefetch.py: items prepared ahead on a thread, in order, errors where they happened."""

import itertools
import threading

import pytest

from transformer.training.prefetch import Prefetcher

pytestmark = pytest.mark.fast


def test_items_come_in_order_prepared_on_another_thread():
    threads = []

    def prepare(n):
        threads.append(threading.current_thread())
        return n * n

    with Prefetcher(iter(range(10)), prepare, depth=3) as items:
        assert list(items) == [(n, n * n) for n in range(10)]
    assert len(threads) == 10 and threading.main_thread() not in threads


def test_depth_zero_prepares_in_line():
    threads = []
    with Prefetcher(iter("ab"), lambda x: threads.append(threading.current_thread()) or x.upper(), depth=0) as items:
        assert list(items) == [("a", "A"), ("b", "B")]
    assert threads == [threading.main_thread()] * 2


def test_it_stays_at_most_depth_items_ahead():
    prepared = []
    ready = threading.Event()

    def prepare(n):
        prepared.append(n)
        if len(prepared) == 3:
            ready.set()
        return n

    with Prefetcher(itertools.count(), prepare, depth=2) as items:
        assert next(items) == (0, 0)
        ready.wait(5)
        # 0 taken, 1 and 2 queued, 3 prepared and waiting for room: never further.
        threading.Event().wait(0.3)
        assert len(prepared) <= 4


def test_an_error_is_raised_at_its_item_and_close_ends_an_endless_producer():
    def prepare(n):
        if n == 2:
            raise ValueError("bad item 2")
        return n

    items = Prefetcher(itertools.count(), prepare, depth=2)
    assert [next(items), next(items)] == [(0, 0), (1, 1)]
    with pytest.raises(ValueError, match="bad item 2"):
        next(items)
    items.close()
    endless = Prefetcher(itertools.count(), lambda n: n, depth=2)
    next(endless)
    endless.close()
    assert not endless._thread.is_alive()
