"""Prometheus metrics, in a registry of their own per app (so two apps in one process never share counters)."""

from __future__ import annotations

import time
from collections.abc import Iterable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .batcher import BatchStats
from .inflight import StepStats

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class Metrics:
    """Requests by path and status, latency; per model (label `model`): batch sizes, queue depth, generated
    tokens, loads and unloads, translation cache hits and misses."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        m = ["model"]
        self.requests = Counter("onnxmt_requests", "HTTP requests by path and status.", ["path", "status"], registry=r)
        self.latency = Histogram(
            "onnxmt_request_duration_seconds", "HTTP request latency.", ["path"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.batch_size = Histogram(
            "onnxmt_batch_size", "Texts per decoder batch.", m, buckets=BATCH_BUCKETS, registry=r
        )
        self.batch_requests = Histogram(
            "onnxmt_batch_requests", "Requests served by one batch.", m, buckets=BATCH_BUCKETS, registry=r
        )
        self.batch_duration = Histogram(
            "onnxmt_batch_duration_seconds", "Inference time of one batch.", m, buckets=LATENCY_BUCKETS, registry=r
        )
        self.queue_depth = Gauge("onnxmt_queue_depth", "Requests waiting for the decoder.", m, registry=r)
        self.running_rows = Gauge("onnxmt_running_rows", "Decoder rows in the running batches.", m, registry=r)
        self.running_requests = Gauge(
            "onnxmt_running_requests", "Requests with texts in the running batches.", m, registry=r
        )
        self.preempted = Counter(
            "onnxmt_preempted_texts", "Running texts that gave their place to a request with none.", m, registry=r
        )
        # In-flight batching: a "batch" above is the requests that joined the running batch at one step.
        self.step_rows = Histogram(
            "onnxmt_step_rows", "Decoder rows per call of the running batch.", m, buckets=BATCH_BUCKETS, registry=r
        )
        self.step_requests = Histogram(
            "onnxmt_step_requests", "Requests with rows in a step of the running batch.", m, buckets=BATCH_BUCKETS,
            registry=r,
        )  # fmt: skip
        self.step_duration = Histogram(
            "onnxmt_step_duration_seconds", "Time of one step of the running batch.", m, buckets=LATENCY_BUCKETS,
            registry=r,
        )  # fmt: skip
        self.join_wait = Histogram(
            "onnxmt_join_wait_seconds", "Time a request waited to join the running batch.", m,
            buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.encoder_texts = Histogram(
            "onnxmt_encoder_texts", "Texts per encoder call of the running batch (waiting requests encoded together).",
            m, buckets=BATCH_BUCKETS, registry=r,
        )  # fmt: skip
        self.generated_tokens = Counter("onnxmt_generated_tokens", "Tokens generated.", m, registry=r)
        self.texts = Counter("onnxmt_translated_texts", "Texts translated by the decoder.", m, registry=r)
        self.rejected = Counter(
            "onnxmt_rejected", "Requests rejected before translation, by reason.", ["reason"], registry=r
        )
        self.ready = Gauge("onnxmt_ready", "1 when the service takes requests.", registry=r)
        self.model_loaded = Gauge("onnxmt_model_loaded", "1 while the model is loaded.", m, registry=r)
        self.model_loads = Counter("onnxmt_model_loads", "Times the model was loaded.", m, registry=r)
        self.model_unloads = Counter(
            "onnxmt_model_unloads", "Times the model was unloaded to make room for another.", m, registry=r
        )
        self.cache_hits = Counter("onnxmt_cache_hits", "Texts answered from the translation cache.", m, registry=r)
        self.cache_misses = Counter("onnxmt_cache_misses", "Texts not in the translation cache.", m, registry=r)
        self.cache_hit_ratio = Gauge(
            "onnxmt_cache_hit_ratio", "Translation cache hits / lookups since start (all models).", registry=r
        )
        self.cache_entries = Gauge("onnxmt_cache_entries", "Translations in the cache.", registry=r)
        self._hits = self._lookups = 0

    def add_model(self, model: str) -> None:
        """Every per-model series at zero from the start, so /metrics lists each model before its first batch."""
        labelled: tuple[MetricWrapperBase, ...] = (
            *(self.batch_size, self.batch_requests, self.batch_duration, self.queue_depth, self.model_loaded),
            *(self.running_rows, self.running_requests, self.preempted),
            *(self.step_rows, self.step_requests, self.step_duration, self.join_wait, self.encoder_texts),
            *(self.generated_tokens, self.texts, self.model_loads, self.model_unloads),
            *(self.cache_hits, self.cache_misses),
        )
        for metric in labelled:
            metric.labels(model)

    def observe_batch(self, model: str, stats: BatchStats) -> None:
        for size in stats.decoder_batches:
            self.batch_size.labels(model).observe(size)
        self.batch_requests.labels(model).observe(stats.requests)
        self.batch_duration.labels(model).observe(stats.seconds)
        self.generated_tokens.labels(model).inc(stats.generated_tokens)
        self.texts.labels(model).inc(sum(stats.decoder_batches))

    def observe_step(self, model: str, stats: StepStats) -> None:
        for rows in stats.rows:
            self.step_rows.labels(model).observe(rows)
        self.step_requests.labels(model).observe(stats.requests)
        for seconds in stats.seconds:
            self.step_duration.labels(model).observe(seconds)
        for wait in stats.join_waits:
            self.join_wait.labels(model).observe(wait)
        for texts in stats.encoder_calls:
            self.encoder_texts.labels(model).observe(texts)
        if stats.admitted_requests:
            self.batch_requests.labels(model).observe(stats.admitted_requests)
            self.batch_size.labels(model).observe(stats.admitted_texts)
            self.texts.labels(model).inc(stats.admitted_texts)
        self.generated_tokens.labels(model).inc(stats.generated_tokens)
        self.observe_running(model, stats.running_rows, stats.running_requests)
        if stats.preempted:
            self.preempted.labels(model).inc(stats.preempted)

    def observe_running(self, model: str, rows: int, requests: int) -> None:
        """What runs now: decoder rows and the requests they belong to (any thread)."""
        self.running_rows.labels(model).set(rows)
        self.running_requests.labels(model).set(requests)

    def observe_cache(self, model: str, hits: int, misses: int, entries: int) -> None:
        if hits:
            self.cache_hits.labels(model).inc(hits)
        if misses:
            self.cache_misses.labels(model).inc(misses)
        self._hits += hits
        self._lookups += hits + misses
        if self._lookups:
            self.cache_hit_ratio.set(self._hits / self._lookups)
        self.cache_entries.set(entries)

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
        # Behind a route prefix (Ray Serve's route_prefix, a proxy's root_path) the path includes the prefix.
        root = scope.get("root_path", "")
        route = scope["path"][len(root) :] if root and scope["path"].startswith(root) else scope["path"]
        path = route if route in self.paths else "other"
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
