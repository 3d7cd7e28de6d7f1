"""Batching across requests: inference threads decode for every request.

A request's sentences join a bounded queue (full: ``QueueFull``, answered 429; more sentences than
it holds when empty: ``TooLarge``, 413; shutting down: ``Unavailable``, 503). A free inference
thread takes what is queued for one version, up to ``max_batch_tokens`` source pieces, groups it by
decoding settings (beam size, alpha, stopping rule), decodes each group as one call of the
translator (which sorts by length), and hands each request its own translations. No timer: a free
thread takes what is there (Marian's Bergamot does the same), so one request alone is decoded at
once and a burst is decoded together. A request whose deadline passed before its batch started is
answered ``DeadlineExceeded`` (503) without being decoded.

How many batches run at once is the version's (``concurrency``): one for our PyTorch search (its
intra-op threads are the parallelism), CTranslate2's ``inter_threads`` for its model (each call
runs on one of its replicas and releases the GIL). With several free, the queue is shared out
between them (a burst of 16 sentences and 2 free replicas: 8 each), so that every replica works.

Health (``problem``): an inference thread that died, a batch decoding for longer than
``stall_seconds``, or requests waiting while no batch finished for that long. The HTTP side bounds
each request's wait itself (``pipeline.serving.server.app``), so a hung decoder delays no answer
past its bound.
"""

from __future__ import annotations

import asyncio
import collections
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from pipeline.config.decoding import DecodingConfig
from pipeline.serving.server.requests import Pieces


class QueueFull(RuntimeError):
    """The queue holds too many sentences now: it drains, a retry may fit."""


class TooLarge(ValueError):
    """A request of more sentences than the queue holds when empty: no retry can fit it."""


class DeadlineExceeded(RuntimeError):
    pass


class Unavailable(RuntimeError):
    """Nothing will decode it: no inference thread is left (each died), or the server is shutting
    down; the message says which."""


@dataclass(eq=False)   # compared by identity: a job is withdrawn from the queue by being itself
class Job:
    """One request: its sentences' pieces, how to decode them, and where the answer goes."""

    ids: list[list[int]]
    model: Any            # the ServedModel current when the request was accepted
    decoding: DecodingConfig   # the version's settings with what the request's params set
    deadline: float       # time.monotonic() by which its batch must have started
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    queued_at: float = field(default_factory=time.monotonic)
    started: float | None = None   # when its batch began decoding (the HTTP side bounds the wait from it)

    @property
    def tokens(self) -> int:
        return sum(len(s) + 1 for s in self.ids)

    def answer(self, result: Any = None, error: BaseException | None = None) -> None:
        def settle() -> None:
            if not self.future.done():   # the request may have been answered already (its bound passed)
                if error is not None:
                    self.future.set_exception(error)
                else:
                    self.future.set_result(result)
        self.loop.call_soon_threadsafe(settle)


def concurrency(model: Any) -> int:
    """Batches ``model`` (a ServedModel) may decode at once: its ``concurrency``, else one."""
    return max(1, int(getattr(model, "concurrency", 1)))


class Batcher:
    """The inference threads (``workers``) and their bounded queue (``max_queue_sentences``)."""

    def __init__(self, max_queue_sentences: int = 512, max_batch_tokens: int = 4096, threads: int | None = None,
                 on_batch: Callable[[int, int, float], None] | None = None, workers: int = 1,
                 stall_seconds: float = 60.0, batch_wait_s: float = 0.0) -> None:
        self.max_queue_sentences, self.max_batch_tokens = max_queue_sentences, max_batch_tokens
        self.threads = threads   # torch's intra-op threads (our search); CTranslate2 has its own
        self.stall_seconds = stall_seconds
        self.batch_wait_s = batch_wait_s
        self.on_batch = on_batch or (lambda sentences, requests, seconds: None)
        self.pending: collections.deque[Job] = collections.deque()
        self.queued_sentences = 0
        self.cond = threading.Condition()
        self.stopping = False
        self.active: collections.Counter[int] = collections.Counter()   # id(model) -> batches decoding
        self.decoding: dict[str, tuple[float, list[Job]]] = {}           # thread -> (started, jobs)
        self.last_finished = time.monotonic()
        self.deaths: dict[str, str] = {}
        self.inference_threads = [threading.Thread(target=self._run, name=f"inference-{i}", daemon=True)
                         for i in range(max(1, workers))]

    @property
    def thread(self) -> threading.Thread:
        """The first inference thread (the only one with ``workers=1``)."""
        return self.inference_threads[0]

    def start(self) -> None:
        for thread in self.inference_threads:
            thread.start()

    def _all_dead(self) -> bool:
        """Every inference thread has recorded its death (not ``is_alive``: a dying thread is alive a
        moment after it recorded it, and a request queued then would wait for nobody)."""
        return len(self.deaths) == len(self.inference_threads)

    def submit(self, job: Job) -> None:
        with self.cond:
            if len(job.ids) > self.max_queue_sentences:
                raise TooLarge(f"{len(job.ids)} sentences in one request; this server queues at most "
                               f"{self.max_queue_sentences} (--max-queue-sentences)")
            if self.stopping:
                raise Unavailable("the server is shutting down")
            if self._all_dead():
                raise Unavailable(self._death())
            if self.queued_sentences + len(job.ids) > self.max_queue_sentences:
                raise QueueFull(f"{self.queued_sentences} sentences queued (limit {self.max_queue_sentences})")
            self.pending.append(job)
            self.queued_sentences += len(job.ids)
            self.cond.notify()

    def withdraw(self, job: Job) -> bool:
        """Take ``job`` out of the queue if no batch has taken it yet (True: it will never be decoded)."""
        with self.cond:
            try:
                self.pending.remove(job)
            except ValueError:
                return False
            self.queued_sentences -= len(job.ids)
            return True

    def depth(self) -> int:
        return self.queued_sentences

    def uses(self, model: Any) -> int:
        """Batches of ``model`` queued or decoding (a swapped-out version is released at 0)."""
        with self.cond:
            return self.active[id(model)] + sum(job.model is model for job in self.pending)

    def problem(self) -> str | None:
        """Why the inference side cannot answer now (``/health/ready`` answers 503 with it), or None."""
        now = time.monotonic()
        with self.cond:
            if self.stopping:
                return None   # draining: the shutdown says so itself
            if self.deaths:
                return self._death()
            for name, (started, jobs) in self.decoding.items():
                if now - started > self.stall_seconds:
                    return (f"{name} has been decoding one batch ({sum(len(j.ids) for j in jobs)} sentences) for "
                            f"{now - started:.0f} s (limit {self.stall_seconds:g} s)")
            waiting = [job.queued_at for job in self.pending]
            if waiting and now - max(min(waiting), self.last_finished) > self.stall_seconds:
                return (f"no batch finished for {now - self.last_finished:.0f} s while {len(waiting)} requests wait "
                        f"(limit {self.stall_seconds:g} s)")
        return None

    def _death(self) -> str:
        name, why = next(iter(self.deaths.items()))
        return f"the inference thread {name} died ({why})"

    def stop(self, timeout_s: float = 30.0) -> None:
        """Decode what is queued, then end the threads (or give up after ``timeout_s``)."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        end = time.monotonic() + timeout_s
        for thread in self.inference_threads:
            if thread.is_alive():
                thread.join(max(0.0, end - time.monotonic()))

    def _take(self) -> list[Job]:
        """Queued jobs of the first version that has a free slot, up to the token budget and to this
        thread's share of what that version has queued (at least one request); [] to stop."""
        with self.cond:
            since = None   # when this thread first found something it could take
            while True:
                head = next((job for job in self.pending if self.active[id(job.model)] < concurrency(job.model)),
                            None)
                if head is not None:
                    since = since or time.monotonic()
                    left = since + self.batch_wait_s - time.monotonic()
                    if left <= 0 or self.stopping or not self._fewer_than_the_others(head.model):
                        break
                    self.cond.wait(left)   # a submit wakes it sooner
                    continue
                if self.stopping and not self.pending:
                    return []
                self.cond.wait()
            model = head.model
            mine = [job for job in self.pending if job.model is model]
            free = concurrency(model) - self.active[id(model)]
            share = math.ceil(sum(len(job.ids) for job in mine) / free)
            taken, tokens, sentences = [], 0, 0
            for job in mine:
                if taken and (tokens + job.tokens > self.max_batch_tokens or sentences + len(job.ids) > share):
                    break
                taken.append(job)
                tokens += job.tokens
                sentences += len(job.ids)
            for job in taken:
                self.pending.remove(job)
            self.queued_sentences -= sentences
            self.active[id(model)] += 1
            return taken

    def _fewer_than_the_others(self, model: Any) -> bool:
        """Whether fewer of ``model``'s sentences are queued than its other replicas are decoding: then
        a free replica waits a moment (``batch_wait_s``) for the requests their answers bring back. At
        16 clients on 2 replicas, taking at once what was there made 45% of the batches one sentence
        long (measured), each step as dear as a batch's; alone, or with every replica free, nothing waits."""
        queued = sum(len(job.ids) for job in self.pending if job.model is model)
        decoding = sum(len(job.ids) for _, jobs in self.decoding.values() for job in jobs if job.model is model)
        return queued < decoding

    def _run(self) -> None:
        """The thread: take, decode, repeat. Anything that escapes ``_decode``'s own handling ends the
        thread; its jobs are answered with the error and the reason is kept for ``problem``."""
        if self.threads:
            torch.set_num_threads(self.threads)
        name = threading.current_thread().name
        jobs: list[Job] = []
        try:
            while jobs := self._take():
                try:
                    self._batch(jobs)
                finally:
                    with self.cond:
                        self.active[id(jobs[0].model)] -= 1
                        self.decoding.pop(name, None)
                        self.cond.notify_all()
        except BaseException as err:   # noqa: BLE001 - recorded, answered, then the thread ends
            with self.cond:
                self.deaths[name] = f"{type(err).__name__}: {str(err)[:200]}"
                if self._all_dead():   # nobody left to take the queue: answered now, not at their bound
                    jobs = [*jobs, *self.pending]
                    self.pending.clear()
                    self.queued_sentences = 0
            for job in jobs:
                job.answer(error=Unavailable(f"the inference thread died: {type(err).__name__}: {err}"))
            raise

    def _batch(self, jobs: list[Job]) -> None:
        now = time.monotonic()
        live = []
        for job in jobs:
            if job.deadline < now:
                job.answer(error=DeadlineExceeded(f"waited {now - job.queued_at:.2f} s in the queue"))
            else:
                live.append(job)
        groups: dict[DecodingConfig, list[Job]] = {}
        for job in live:
            groups.setdefault(job.decoding, []).append(job)
        for group in groups.values():
            with self.cond:
                started = time.monotonic()
                self.decoding[threading.current_thread().name] = (started, group)
                for job in group:
                    job.started = started
            self._decode(group)
            with self.cond:
                self.last_finished = time.monotonic()

    def _decode(self, group: list[Job]) -> None:
        first = group[0]
        ids = [sentence for job in group for sentence in job.ids]
        started = time.monotonic()
        try:
            with torch.inference_mode():
                hypotheses = first.model.translator.translate_ids(ids, **first.decoding.per_request())
            texts = Pieces(first.model.translator.tokenizer).decode(hypotheses)
        except Exception as err:   # noqa: BLE001 - answered as a 500 to each request of the batch
            for job in group:
                job.answer(error=err)
            return
        self.on_batch(len(ids), len(group), time.monotonic() - started)
        at = 0
        for job in group:
            job.answer(texts[at:at + len(job.ids)])
            at += len(job.ids)
