"""Batching across requests: one inference thread decodes for every request.

A request's sentences join a bounded queue (full: ``QueueFull``, answered 429). The thread takes
everything queued, up to ``max_batch_tokens`` source pieces, groups it by the version the request
was accepted on and its decoding settings (beam size, alpha, stopping rule), decodes each group as one call of
the translator (which sorts by length), and hands each request its own translations. No timer:
a free thread takes what is there (Marian's Bergamot does the same), so one request alone is
decoded at once and a burst is decoded together. A request whose deadline passed before its batch
started is answered ``DeadlineExceeded`` (503) without being decoded.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from pipeline.serving.decoding import DecodingConfig


class QueueFull(RuntimeError):
    pass


class DeadlineExceeded(RuntimeError):
    pass


@dataclass
class Job:
    """One request: its sentences' pieces, how to decode them, and where the answer goes."""

    ids: list[list[int]]
    model: Any            # the ServedModel current when the request was accepted
    decoding: DecodingConfig   # the version's settings with what the request's params set
    deadline: float       # time.monotonic() by which its batch must have started
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    queued_at: float = field(default_factory=time.monotonic)

    @property
    def tokens(self) -> int:
        return sum(len(s) + 1 for s in self.ids)

    def answer(self, result: Any = None, error: BaseException | None = None) -> None:
        def settle() -> None:
            if not self.future.done():
                if error is not None:
                    self.future.set_exception(error)
                else:
                    self.future.set_result(result)
        self.loop.call_soon_threadsafe(settle)


class Batcher:
    """The inference thread and its bounded queue (``max_queue_sentences``)."""

    def __init__(self, max_queue_sentences: int = 512, max_batch_tokens: int = 4096, threads: int | None = None,
                 on_batch: Callable[[int, int, float], None] | None = None) -> None:
        self.max_queue_sentences, self.max_batch_tokens = max_queue_sentences, max_batch_tokens
        self.threads = threads
        self.on_batch = on_batch or (lambda sentences, requests, seconds: None)
        self.pending: collections.deque[Job] = collections.deque()
        self.queued_sentences = 0
        self.cond = threading.Condition()
        self.stopping = False
        self.thread = threading.Thread(target=self._loop, name="inference", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def submit(self, job: Job) -> None:
        with self.cond:
            if self.stopping:
                raise QueueFull("the server is shutting down")
            if self.queued_sentences + len(job.ids) > self.max_queue_sentences:
                raise QueueFull(f"{self.queued_sentences} sentences queued (limit {self.max_queue_sentences})")
            self.pending.append(job)
            self.queued_sentences += len(job.ids)
            self.cond.notify()

    def depth(self) -> int:
        return self.queued_sentences

    def stop(self, timeout_s: float = 30.0) -> None:
        """Decode what is queued, then end the thread (or give up after ``timeout_s``)."""
        with self.cond:
            self.stopping = True
            self.cond.notify()
        self.thread.join(timeout_s)

    def _take(self) -> list[Job]:
        """Everything queued up to the token budget (at least one request)."""
        with self.cond:
            while not self.pending and not self.stopping:
                self.cond.wait()
            taken, tokens = [], 0
            while self.pending and (not taken or tokens + self.pending[0].tokens <= self.max_batch_tokens):
                job = self.pending.popleft()
                self.queued_sentences -= len(job.ids)
                taken.append(job)
                tokens += job.tokens
            return taken

    def _loop(self) -> None:
        if self.threads:
            torch.set_num_threads(self.threads)
        while True:
            jobs = self._take()
            if not jobs:
                return   # stopping, queue empty
            now = time.monotonic()
            live = []
            for job in jobs:
                if job.deadline < now:
                    job.answer(error=DeadlineExceeded(f"waited {now - job.queued_at:.2f} s in the queue"))
                else:
                    live.append(job)
            groups: dict[tuple[int, DecodingConfig], list[Job]] = {}
            for job in live:
                groups.setdefault((id(job.model), job.decoding), []).append(job)
            for group in groups.values():
                self._decode(group)

    def _decode(self, group: list[Job]) -> None:
        first = group[0]
        ids = [sentence for job in group for sentence in job.ids]
        started = time.monotonic()
        try:
            with torch.inference_mode():
                hypotheses = first.model.translator.translate_ids(ids, **first.decoding.per_request())
            texts = first.model.translator.tokenizer.decode(hypotheses)
        except Exception as err:   # noqa: BLE001 - answered as a 500 to each request of the batch
            for job in group:
                job.answer(error=err)
            return
        self.on_batch(len(ids), len(group), time.monotonic() - started)
        at = 0
        for job in group:
            job.answer(texts[at:at + len(job.ids)])
            at += len(job.ids)
