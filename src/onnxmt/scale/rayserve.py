"""The service on Ray Serve: the same FastAPI app (`serve.app.create_app`) in every replica, behind a gateway.

Two deployments. `Replica` (as many as asked, or autoscaled) builds its own `Service` for the model directories
(one `Translator` per model, its micro-batcher and inference thread, as `onnxmt serve` runs them) and runs the app's
lifespan, so the API, limits, errors, metrics and page are the ones of the single-process service. Its first health
check waits until its models are opened, so Ray routes nothing to a replica still loading, and a replica whose
models cannot be opened fails to start. `Gateway`, the HTTP ingress behind Ray's proxy, reads each request and
forwards it whole to a replica through a deployment handle; when that replica dies with the request, the gateway
sends it to another. Without the gateway (the app itself as the ingress), Ray's proxy answers 500 for a request
running on a replica that dies: measured in tests/scale/test_rayserve.py and docs/scale-out.md.

Three ways in: `onnxmt serve DIR --ray --replicas N`; `serve run onnxmt.scale.rayserve:app_builder model_dir=DIR`;
a Serve config file whose `import_path` is `onnxmt.scale.rayserve:app_builder` (docs/scale-out.md).

`/metrics` is the deployment's: each replica pushes its counters to a third deployment, `MetricsBoard`, every
METRICS_PUSH_SECONDS, and the gateway answers /metrics with their sum over the replicas (counters, histograms and
gauges added up; `onnxmt_replicas_reporting` says how many replicas it summed). A client that disconnects cancels
its request in the replica that holds it: Ray cancels the gateway's call and its call to the replica, and the
replica tells its app that the client has gone, so the work stops and the request is counted as 499, as in one
process. What is per replica: the translation cache, and the models a multi-model replica has loaded.
"""

from __future__ import annotations

import dataclasses
import time
import types
import typing
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ..extras import missing_extra
from ..options import check, option, split_list
from ..runtime.options import DecodeOptions, RuntimeOptions
from ..serve.options import ServeOptions

if TYPE_CHECKING:
    from fastapi import FastAPI
    from ray.serve import Application

__all__ = ["RayServeOptions", "app_builder", "application", "run"]

T = TypeVar("T")


@dataclass(frozen=True)
class RayServeOptions:
    """How the deployment scales: a fixed number of replicas, or autoscaling between min_replicas and max_replicas
    (either one set turns it on; `replicas` is then the initial number), on ongoing requests per replica against
    target_ongoing_requests."""

    replicas: int = option(1, help="With --ray: replicas (the initial number when autoscaling).", min=1)
    min_replicas: int | None = option(None, help="With --ray: autoscale, down to this many.", min=0)
    max_replicas: int | None = option(None, help="With --ray: autoscale, up to this many.")
    cpus_per_replica: float = option(1.0, help="With --ray: CPUs per replica (its threads unless --threads).", above=0)
    # Two batches by default, so the next batch is queued while one runs; more wait in Ray's router.
    max_ongoing_requests: int | None = option(
        None, help="Requests Ray sends a replica at once (default: 2 x max_batch_size).", min=1
    )
    target_ongoing_requests: float | None = option(
        None, help="Autoscaling: ongoing requests per replica to aim at (default: max_batch_size, a full batch)."
    )
    name: str = option("onnxmt", help="The Serve application's name.")
    route_prefix: str = option("/", help="The Serve application's route prefix.")

    def __post_init__(self) -> None:
        check(self)
        if self.max_replicas is not None and self.max_replicas < max(1, self.min_replicas or 0):
            raise ValueError(f"max_replicas must be at least 1 and min_replicas, got {self.max_replicas}")

    @property
    def autoscaling(self) -> bool:
        return self.min_replicas is not None or self.max_replicas is not None


def _import_serve() -> Any:
    try:
        from ray import serve
    except ImportError as e:
        raise missing_extra("the service on Ray Serve", "ray", e) from e
    return serve


class Replica:
    """One replica: the app of `create_app`, its lifespan (the service's start and stop) run here, answering the
    HTTP requests the gateway forwards, whole, through a deployment handle."""

    async def __init__(  # type: ignore[misc]  # Ray awaits a replica's async constructor
        self,
        model_dirs: list[str],
        options: ServeOptions,
        runtime: RuntimeOptions,
        decoding: DecodeOptions,
        board: Any = None,
    ) -> None:
        import asyncio
        import uuid

        from ..serve.app import create_app

        self.app: FastAPI = create_app(model_dirs, options, runtime, decoding)
        self.service = self.app.state.service
        self._lifespan = self.app.router.lifespan_context(self.app)
        await self._lifespan.__aenter__()
        self._board, self._id = board, uuid.uuid4().hex
        self._pushing = asyncio.ensure_future(self._push()) if board is not None else None

    async def __del__(self) -> None:
        """Ray calls this when it stops the replica, after the requests it holds are answered."""
        pushing = getattr(self, "_pushing", None)
        if pushing is not None:
            pushing.cancel()
            self._board.drop.remote(self._id)  # not awaited: the board may be stopping too (the app deleted)
        lifespan = getattr(self, "_lifespan", None)  # None: the constructor failed before the service started
        if lifespan is not None:
            await lifespan.__aexit__(None, None, None)

    async def _push(self) -> None:
        """This replica's /metrics text to the board, every METRICS_PUSH_SECONDS."""
        import asyncio
        import logging

        while True:
            try:
                await self._board.put.remote(self._id, self.service.metrics.render().decode())
            except Exception as e:  # the board restarting: the next push makes up for it
                logging.getLogger("ray.serve").warning("could not push this replica's metrics: %s", e)
            await asyncio.sleep(METRICS_PUSH_SECONDS)

    async def check_health(self) -> None:
        """Ray's health check: it fails while the models cannot be opened or the service stops (Ray then
        replaces the replica). The first one, before the replica gets traffic, waits for the models."""
        await self.service.opened()
        if not self.service.ready:
            reason = "shutting down" if self.service.draining else self.service.error or "not ready"
            raise RuntimeError(f"onnxmt replica not ready: {reason}")

    async def answer(self, scope: dict[str, Any], body: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """One HTTP request through the app: (status, headers, body). When Ray cancels this call (the client
        disconnected from the proxy), the app is told the client has gone, as uvicorn tells it, and given
        DISCONNECT_GRACE_SECONDS to stop its work and count the request (499)."""
        import asyncio

        delivered = False
        gone = asyncio.Event()
        messages: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
            messages.append(dict(message))

        running = asyncio.ensure_future(self.app(scope, receive, send))
        try:
            await asyncio.shield(running)
        except asyncio.CancelledError:
            gone.set()
            await asyncio.wait([running], timeout=DISCONNECT_GRACE_SECONDS)
            running.cancel()
            raise
        start = next(m for m in messages if m["type"] == "http.response.start")
        content = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
        return start["status"], list(start.get("headers", [])), content


# The scope keys a request needs in the replica (not Ray's own, which do not pickle).
SCOPE_KEYS = ("type", "asgi", "http_version", "method", "scheme", "path", "raw_path", "query_string", "root_path")


class Gateway:
    """The ingress: reads each HTTP request and sends it, whole, to a replica through a deployment handle. When
    the replica dies while it holds the request, Ray's handle raises an actor error and the gateway sends the
    request again, to another replica (a translation has no side effect, so it is safe to repeat), `retries`
    times at most; then 503. Ray's own proxy answers such a request 500 and does not repeat it."""

    def __init__(self, replicas: Any, max_body_bytes: int, board: Any = None, retries: int = 3) -> None:
        self.replicas = replicas
        self.board = board
        self.max_body_bytes = max_body_bytes
        self.retries = retries
        self.repeated = 0  # requests sent again after their replica died

    def __serve_build_asgi_app__(self) -> Any:
        # A plain coroutine function: uvicorn (which runs the lifespan in Ray) takes a bound method for ASGI 2.
        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            await self._asgi(scope, receive, send)

        return app

    def repeated_requests(self) -> int:
        """Requests this gateway sent again after their replica died (through a handle: `.remote()`)."""
        return self.repeated

    async def _asgi(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                kind = message["type"].rsplit(".", 1)[-1]
                await send({"type": f"lifespan.{kind}.complete"})
                if kind == "shutdown":
                    return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            # One byte past the limit is enough for the replica's BodyLimitMiddleware to answer 413.
            if size > self.max_body_bytes or not message.get("more_body"):
                break
        forwarded = {k: scope[k] for k in SCOPE_KEYS if k in scope}
        forwarded["headers"] = [(bytes(k), bytes(v)) for k, v in scope.get("headers", [])]
        forwarded["client"] = tuple(scope["client"]) if scope.get("client") else None
        forwarded["server"] = tuple(scope["server"]) if scope.get("server") else None
        status, headers, body = await self._forward(forwarded, b"".join(chunks))
        path = str(scope.get("path", ""))
        path = path[len(scope.get("root_path", "")) :] if path.startswith(scope.get("root_path", "")) else path
        if status == 200 and path == "/metrics" and self.board is not None:
            # A replica answered (it checks access as the app does); the answer is every replica's, summed.
            body = merged_metrics(await self.board.texts.remote(), self.repeated)
            headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
            headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _forward(self, scope: dict[str, Any], body: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        import json
        import logging

        from ray.exceptions import RayActorError

        for attempt in range(self.retries + 1):
            try:
                answer: tuple[int, list[tuple[bytes, bytes]], bytes] = await self.replicas.answer.remote(scope, body)
                return answer
            except RayActorError as e:
                self.repeated += 1
                # Ray's serve logger: its records go to the replica's log file.
                logging.getLogger("ray.serve").warning(
                    "the replica of %s %s died (attempt %d): %s", scope["method"], scope["path"], attempt + 1, e
                )
        message = json.dumps({"error": f"the replicas died {self.retries + 1} times while translating; retry later"})
        headers = [(b"content-type", b"application/json"), (b"retry-after", b"1")]
        return 503, headers, message.encode()


# How often each replica pushes its metrics to the board: /metrics lags the replicas by at most this.
METRICS_PUSH_SECONDS = 1.0
# A replica silent this long (killed, not stopped) leaves the sum.
METRICS_STALE_SECONDS = 30.0
# How long a replica gives a request whose client disconnected to stop its work and be counted.
DISCONNECT_GRACE_SECONDS = 5.0


class MetricsBoard:
    """Each replica's /metrics text as it last pushed it (one replica of this deployment, no CPU)."""

    def __init__(self) -> None:
        self._texts: dict[str, tuple[float, str]] = {}

    def put(self, replica: str, text: str) -> None:
        self._texts[replica] = (time.monotonic(), text)

    def drop(self, replica: str) -> None:
        self._texts.pop(replica, None)

    def texts(self) -> list[str]:
        now = time.monotonic()
        self._texts = {k: (t, text) for k, (t, text) in self._texts.items() if now - t < METRICS_STALE_SECONDS}
        return [text for _, text in self._texts.values()]


def merged_metrics(texts: Sequence[str], repeated: int = 0) -> bytes:
    """Prometheus texts of several replicas as one: every sample (name and labels) summed over them; the process's
    own families (process_*, python_*) left out, which do not add up. `onnxmt_replicas_reporting` counts them;
    `onnxmt_gateway_repeated_requests_total` is `repeated`, the requests the gateway sent again."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
    from prometheus_client.parser import text_string_to_metric_families

    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            if family.name.startswith(("process_", "python_")):
                continue
            families.setdefault(family.name, family)
            sums = values.setdefault(family.name, {})
            for point in family.samples:
                key = (point.name, tuple(sorted(point.labels.items())))
                sums[key] = sums.get(key, 0.0) + point.value
    merged = []
    for name, family in families.items():
        out = Metric(name, family.documentation, family.type)
        for (sample_name, labels), value in values[name].items():
            out.add_sample(sample_name, dict(labels), value)
        merged.append(out)
    replicas = GaugeMetricFamily("onnxmt_replicas_reporting", "Replicas whose metrics this answer sums.")
    replicas.add_metric([], len(texts))
    merged.append(replicas)
    again = CounterMetricFamily(
        "onnxmt_gateway_repeated_requests", "Requests the gateway sent again after their replica died."
    )
    again.add_metric([], repeated)
    merged.append(again)

    class Collected:
        def collect(self) -> list[Metric]:
            return merged

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collected())
    return generate_latest(registry)


def application(
    model_dirs: str | Path | Sequence[str | Path],
    options: ServeOptions = ServeOptions(),
    runtime: RuntimeOptions = RuntimeOptions(),
    decoding: DecodeOptions = DecodeOptions(),
    scaling: RayServeOptions = RayServeOptions(),
) -> Application:
    """The Serve application: a deployment of `Replica`, bound to the model directories, for `serve.run`."""
    serve = _import_serve()
    given = [model_dirs] if isinstance(model_dirs, (str, Path)) else list(model_dirs)
    if not given:
        raise ValueError("no model directory given")
    if runtime.threads is None:  # all the machine's cores would oversubscribe them with a replica per core
        runtime = replace(runtime, threads=max(1, int(scaling.cpus_per_replica)))
    settings: dict[str, Any] = {
        "name": "onnxmt",
        "ray_actor_options": {"num_cpus": scaling.cpus_per_replica},
        "max_ongoing_requests": scaling.max_ongoing_requests or 2 * options.max_batch_size,
        # A health check waits at most this long; loading a model happens before the first one.
        "health_check_period_s": 5.0,
        "health_check_timeout_s": 30.0,
        # Ray stops a replica (scale-down, redeploy) only after the requests it holds are answered.
        "graceful_shutdown_timeout_s": options.timeout + 5.0 if options.timeout else 60.0,
    }
    if scaling.autoscaling:
        settings["autoscaling_config"] = {
            "min_replicas": scaling.min_replicas if scaling.min_replicas is not None else 1,
            "max_replicas": scaling.max_replicas if scaling.max_replicas is not None else scaling.replicas,
            "initial_replicas": scaling.replicas,
            "target_ongoing_requests": scaling.target_ongoing_requests or options.max_batch_size,
        }
    else:
        settings["num_replicas"] = scaling.replicas
    board = serve.deployment(MetricsBoard, name="metrics", ray_actor_options={"num_cpus": 0}).bind()
    replicas = serve.deployment(Replica, **settings).bind([str(d) for d in given], options, runtime, decoding, board)
    gateway = serve.deployment(serve.ingress()(Gateway), name="gateway", ray_actor_options={"num_cpus": 0})
    return gateway.bind(replicas, options.max_body_bytes, board)


def run(
    model_dirs: str | Path | Sequence[str | Path],
    options: ServeOptions,
    runtime: RuntimeOptions = RuntimeOptions(),
    decoding: DecodeOptions = DecodeOptions(),
    scaling: RayServeOptions = RayServeOptions(),
    address: str | None = None,
) -> None:
    """`onnxmt serve --ray`: deploy on a Ray cluster (a local one unless `address`), Ray's proxy listening on
    options.host:options.port, until Ctrl+C or SIGTERM; then the application is deleted."""
    import signal

    import ray

    serve = _import_serve()
    ray.init(address=address, configure_logging=False)
    try:
        serve.start(http_options={"host": options.host, "port": options.port})
        serve.run(application(model_dirs, options, runtime, decoding, scaling), **_target(scaling))
        stopping: list[int] = []
        signal.signal(signal.SIGTERM, lambda sig, frame: stopping.append(sig))
        try:
            while not stopping:
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
        serve.delete(scaling.name)
        if address is None:
            serve.shutdown()
    finally:
        ray.shutdown()


def _target(scaling: RayServeOptions) -> dict[str, Any]:
    return {"name": scaling.name, "route_prefix": scaling.route_prefix}


# `serve run onnxmt.scale.rayserve:app_builder key=value ...` and a config file's `args:` arrive here, as strings
# (CLI) or YAML values (config). Each key is a field of one of the options dataclasses, or model_dir(s).
_OPTIONS = (ServeOptions, RuntimeOptions, DecodeOptions, RayServeOptions)


def app_builder(args: Mapping[str, Any]) -> Application:
    """The application for `serve run` / a Serve config: `model_dir` (one directory, or several comma-separated)
    or `model_dirs` (a list), and any ServeOptions, RuntimeOptions, DecodeOptions or RayServeOptions field
    (`replicas=2`, `max_batch_size=32`, `threads=1`, `beams=4`, `max_replicas=4`, ...)."""
    args = dict(args)
    dirs = args.pop("model_dirs", None) or split_list(args.pop("model_dir", None))
    if isinstance(dirs, str):
        dirs = split_list(dirs)
    if not dirs:
        raise ValueError("app_builder needs model_dir=DIR (or model_dirs: [DIR, ...] in a config file)")
    options = _build(ServeOptions, args)
    runtime = _build(RuntimeOptions, args)
    decoding = _build(DecodeOptions, args)
    scaling = _build(RayServeOptions, args)
    if args:
        valid = sorted({f.name for cls in _OPTIONS for f in dataclasses.fields(cls)} | {"model_dir", "model_dirs"})
        raise ValueError(f"unknown argument(s) {', '.join(sorted(args))}; valid: {', '.join(valid)}")
    return application(list(dirs), options, runtime, decoding, scaling)


def _build(cls: type[T], args: dict[str, Any]) -> T:
    """An options dataclass from the arguments that are its fields (taken out of `args`)."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    return cls(**{k: _coerce(args.pop(k), hints[k], k) for k in names if k in args})


def _coerce(value: Any, hint: Any, name: str) -> Any:
    """A `serve run` string (or a YAML value) as the field's type: int, float, bool, str, tuple[str, ...], or
    one of them or None."""
    if not isinstance(value, str):
        return tuple(value) if isinstance(value, list) else value
    kinds = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if type(None) in kinds and value.lower() in ("", "none", "null"):
        return None
    kind = next(k for k in kinds if k is not type(None))
    if kind is bool:
        if value.lower() not in ("1", "0", "true", "false", "yes", "no"):
            raise ValueError(f"{name}={value!r}: expected true or false")
        return value.lower() in ("1", "true", "yes")
    if typing.get_origin(kind) is tuple:
        return split_list(value)
    try:
        return kind(value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name}={value!r}: expected {getattr(kind, '__name__', kind)}") from e
