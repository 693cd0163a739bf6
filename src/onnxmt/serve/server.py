"""Running the app under uvicorn, with the stop behaviour an orchestrator expects.

SIGTERM (or Ctrl+C): readiness turns false, the listening socket closes, the requests in flight are finished and
answered, then the batcher and the inference thread stop and the process exits 0.
"""

from __future__ import annotations

import contextlib
import copy
import math
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import uvicorn
from uvicorn.config import LOGGING_CONFIG

from ..runtime.options import DecodeOptions, RuntimeOptions
from .app import create_app
from .options import ServeOptions
from .service import Service

# Beyond the request timeout, how long a graceful stop waits for requests in flight before cancelling them.
SHUTDOWN_GRACE = 5.0


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


def run(
    model_dir: str | Path,
    options: ServeOptions,
    runtime: RuntimeOptions = RuntimeOptions(),
    decoding: DecodeOptions = DecodeOptions(),
) -> None:
    """Serve until SIGTERM or Ctrl+C; ServeError if the model cannot be loaded."""
    app = create_app(model_dir, options, runtime, decoding)
    service: Service = app.state.service
    config = uvicorn.Config(
        app,
        host=options.host,
        port=options.port,
        log_level=options.log_level,
        access_log=options.access_log,
        log_config=_log_config(options.log_level),
        timeout_graceful_shutdown=math.ceil(options.timeout + SHUTDOWN_GRACE) if options.timeout else None,
        server_header=False,
    )
    server = _Server(config, service)

    def stop(message: str) -> None:
        server.should_exit = True

    service.on_fatal = stop
    server.run()
    if service.error:
        raise ServeError(service.error)


def _log_config(level: str) -> dict:
    """uvicorn's logging, plus onnxmt's own logger on the same handler."""
    config = copy.deepcopy(LOGGING_CONFIG)
    config["loggers"]["onnxmt"] = {"handlers": ["default"], "level": level.upper(), "propagate": False}
    return config
