"""The server's Prometheus metrics (prometheus_client), on a registry of its own (``/metrics``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("translation_requests", "HTTP requests to /invocations by status", ["status"],
                                registry=r)
        self.sentences = Counter("translation_sentences", "Sentences translated", registry=r)
        self.queue_depth = Gauge("translation_queue_sentences", "Sentences waiting for the inference thread",
                                 registry=r)
        self.batch_sentences = Histogram("translation_batch_sentences", "Sentences per decoded batch",
                                         buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=r)
        self.batch_requests = Histogram("translation_batch_requests", "Requests per decoded batch",
                                        buckets=(1, 2, 4, 8, 16, 32, 64), registry=r)
        self.batch_seconds = Histogram("translation_batch_seconds", "Decoding time of a batch", registry=r,
                                       buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
        self.latency = Histogram("translation_request_seconds", "Time from request to answer, by status",
                                 ["status"], registry=r,
                                 buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
        self.model = Info("translation_model", "The version served", registry=r)
        self.swaps = Counter("translation_model_swaps", "Live swaps to another version", registry=r)
        self.swap_failures = Counter("translation_model_swap_failures", "Versions that failed to load", registry=r)

    def on_batch(self, sentences: int, requests: int, seconds: float) -> None:
        self.batch_sentences.observe(sentences)
        self.batch_requests.observe(requests)
        self.batch_seconds.observe(seconds)
        self.sentences.inc(sentences)
