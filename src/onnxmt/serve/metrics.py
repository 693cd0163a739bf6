"""Prometheus metrics, in a registry of their own per app (so two apps in one process never share counters)."""

from __future__ import annotations

import time
from collections.abc import Iterable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .batcher import BatchStats

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class Metrics:
    """Requests by path and status, latency, batch sizes, queue depth, generated tokens."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("onnxmt_requests", "HTTP requests by path and status.", ["path", "status"], registry=r)
        self.latency = Histogram(
            "onnxmt_request_duration_seconds", "HTTP request latency.", ["path"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.batch_size = Histogram("onnxmt_batch_size", "Texts per decoder batch.", buckets=BATCH_BUCKETS, registry=r)
        self.batch_requests = Histogram(
            "onnxmt_batch_requests", "Requests served by one batch.", buckets=BATCH_BUCKETS, registry=r
        )
        self.batch_duration = Histogram(
            "onnxmt_batch_duration_seconds", "Inference time of one batch.", buckets=LATENCY_BUCKETS, registry=r
        )
        self.queue_depth = Gauge("onnxmt_queue_depth", "Requests waiting for the decoder.", registry=r)
        self.generated_tokens = Counter("onnxmt_generated_tokens", "Tokens generated.", registry=r)
        self.texts = Counter("onnxmt_translated_texts", "Texts translated.", registry=r)
        self.rejected = Counter(
            "onnxmt_rejected", "Requests rejected before translation, by reason.", ["reason"], registry=r
        )
        self.ready = Gauge("onnxmt_ready", "1 when the model is loaded and the service takes requests.", registry=r)

    def observe_batch(self, stats: BatchStats) -> None:
        for size in stats.decoder_batches:
            self.batch_size.observe(size)
        self.batch_requests.observe(stats.requests)
        self.batch_duration.observe(stats.seconds)
        self.generated_tokens.inc(stats.generated_tokens)
        self.texts.inc(sum(stats.decoder_batches))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class MetricsMiddleware:
    """Counts every HTTP response and times it; paths outside the app's routes count as "other", so a scan of
    random URLs cannot grow the label set."""

    def __init__(self, app: ASGIApp, metrics: Metrics, paths: Iterable[str]) -> None:
        self.app = app
        self.metrics = metrics
        self.paths = frozenset(paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"] if scope["path"] in self.paths else "other"
        started = time.perf_counter()
        status = 500  # what the client sees if the app raises before answering

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            self.metrics.requests.labels(path, str(status)).inc()
            self.metrics.latency.labels(path).observe(time.perf_counter() - started)
