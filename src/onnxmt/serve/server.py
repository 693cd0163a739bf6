"""Running the app under uvicorn, with the stop behaviour an orchestrator expects.

SIGTERM (or Ctrl+C): readiness turns false and the listening socket closes. Requests in flight are answered: with
their translation when it is ready within their deadline, else 503 + Retry-After (their work is cancelled at that
deadline, so nothing runs past `--timeout`). Open keep-alive connections stay open meanwhile, and a request that
arrives on one gets 503; every response from then on says `Connection: close`. Then the connections close, the
batcher and the inference thread stop, and the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import math
import re
import signal
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from types import FrameType

import uvicorn
from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.config import LOGGING_CONFIG

from .connections import KEEP_ALIVE_GRACE, guarded_protocol
from .guards import HttpMiddleware, with_header
from .service import Service

FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,39}")
# Beyond the request timeout, how long a graceful stop waits for requests in flight before cancelling them.
SHUTDOWN_GRACE = 5.0
# After the last request in flight is answered, how long idle keep-alive connections stay open to answer (503,
# Connection: close) a request a client had already sent on one.
LINGER = 0.2


class ServeError(RuntimeError):
    """The service could not start (the model did not load); the message says why."""


class _Server(uvicorn.Server):
    """uvicorn re-raises SIGTERM after its graceful shutdown, so the process would end as killed by the signal
    (exit 143). For an orchestrator SIGTERM is the normal way to stop: after a clean drain, exit 0."""

    def __init__(self, config: uvicorn.Config, service: Service) -> None:
        super().__init__(config)
        self.service = service

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.service.draining = True
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's shutdown closes idle keep-alive connections at once, so a request already on its way over one
        gets no answer. Stop accepting first, and keep the connections open while requests are in flight (they end
        by their deadline, `--timeout`): each request on them is answered 503 with `Connection: close`."""
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        grace = self.config.timeout_graceful_shutdown
        deadline = None if grace is None else time.monotonic() + grace
        while self.server_state.tasks and not self.force_exit:
            if deadline is not None and time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(LINGER)
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


def run(app: FastAPI) -> None:
    """Serve `app` (`create_app`'s) until SIGTERM or Ctrl+C; ServeError if the models cannot be opened."""
    service: Service = app.state.service
    options = service.options
    config = uvicorn.Config(
        _CloseWhenDraining(app, service),
        host=options.host,
        port=options.port,
        log_level=options.log_level,
        access_log=options.access_log,
        log_config=_log_config(options.log_level),
        timeout_graceful_shutdown=math.ceil(options.timeout + SHUTDOWN_GRACE) if options.timeout else None,
        server_header=False,
        # X-Forwarded-For/-Proto change what the service takes for the client and the scheme (translatedFileUrl):
        # trusted only from the proxies named, never by default (uvicorn's default trusts 127.0.0.1).
        proxy_headers=bool(options.forwarded_allow_ips),
        forwarded_allow_ips=options.forwarded_allow_ips or "",
        # Slow clients (connections.py): a deadline per request, a cap on open connections, idle keep-alive.
        http=guarded_protocol(options.request_timeout, options.max_connections),
        # Responses announce keep_alive_timeout; the connection is kept a little longer (connections.py).
        timeout_keep_alive=options.keep_alive_timeout + KEEP_ALIVE_GRACE,  # type: ignore[arg-type]  # a float works
    )
    server = _Server(config, service)

    def stop(message: str) -> None:
        server.should_exit = True

    service.on_fatal = stop
    server.run()
    if service.error:
        raise ServeError(service.error)


class _CloseWhenDraining(HttpMiddleware):
    """While the service stops, every response carries `Connection: close`: clients do not reuse a connection
    the server is about to close. Otherwise an HTTP/1.1 response that keeps its connection says for how long:
    `Keep-Alive: timeout=N` (--keep-alive-timeout; the server waits KEEP_ALIVE_GRACE more before closing it)."""

    def __init__(self, app: ASGIApp, service: Service) -> None:
        self.app = app
        self.service = service
        self.keep_alive = f"timeout={self.service.options.keep_alive_timeout:g}".encode()

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        closes = scope.get("http_version") != "1.1" or _says_close(scope.get("headers", []))

        async def closing(message: Message) -> None:
            if message["type"] == "http.response.start":
                if self.service.draining:
                    message = with_header(message, b"connection", b"close")
                elif not closes and not _says_close(message.get("headers", [])):
                    message = with_header(message, b"keep-alive", self.keep_alive)
            await send(message)

        await self.app(scope, receive, closing)


def _says_close(headers: Sequence[tuple[bytes, bytes]]) -> bool:
    """Whether headers hold `Connection: close`."""
    return any(name.lower() == b"connection" and b"close" in value.lower() for name, value in headers)


def _log_config(level: str) -> dict:
    """uvicorn's logging, plus onnxmt's own logger on the same handler; the access log without query values."""
    config = copy.deepcopy(LOGGING_CONFIG)
    config["loggers"]["onnxmt"] = {"handlers": ["default"], "level": level.upper(), "propagate": False}
    config.setdefault("filters", {})["query_values"] = {"()": HideQueryValues}
    config["loggers"]["uvicorn.access"]["filters"] = ["query_values"]
    return config


class HideQueryValues(logging.Filter):
    """uvicorn's access log shows the full path, query string included; deep-translator sends the text and the API
    key there. Every value is replaced by `*`, names kept: `POST /translate?q=*&target=*&api_key=*`."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        # uvicorn's access record: (client address, method, path with query, HTTP version, status)
        if isinstance(args, tuple) and len(args) == 5 and isinstance(args[2], str) and "?" in args[2]:
            path, _, query = args[2].partition("?")
            items = (item.partition("=") for item in query.split("&") if item)
            # A "name" without "=", or that is not a plain word, may be a text sent without a name: hidden too.
            shown = "&".join(f"{n if eq and FIELD_NAME.fullmatch(n) else '*'}=*" for n, eq, _ in items)
            record.args = (*args[:2], f"{path}?{shown}", *args[3:])
        return True
