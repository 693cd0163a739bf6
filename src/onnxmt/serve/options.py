"""`ServeOptions`: the service's settings, shared by the CLI (`onnxmt serve`, flags default from `ONNXMT_*`) and
the app factory."""

from __future__ import annotations

from dataclasses import dataclass

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")  # uvicorn's


@dataclass(frozen=True)
class ServeOptions:
    """How the service listens, batches and limits.

    max_batch_size: most texts per decoder batch. batch_window_ms: how long the first request of a batch waits for
    others to join it; a short window trades a little latency at low load for much throughput at high load.
    max_queue: requests waiting for the decoder beyond the running batch; one more gets 503 with Retry-After,
    so memory and latency stay bounded under overload. timeout: seconds a request may wait and run (0: no limit).
    max_chars / max_texts / max_body_bytes / max_beams: per-request limits. api_keys: when non-empty, /translate
    needs one of them as `api_key`; protect_all: every endpoint but /health and /ready does. cors_origins: origins
    allowed to call the API from a browser ("*" for any). max_request_cost: most tokens x beams one request may cost
    (Translator.cost: source tokens + max new tokens, times beams, summed over its texts); more gets 413.
    max_batch_cost: most tokens x beams per decoder batch, which bounds the decoder's memory (0: no limit, for both).
    Slow clients: request_timeout: seconds a connection may take to send a whole request (headers and body),
    counted from the moment the connection opened or, on a kept-alive connection, from the request's first byte;
    then it is answered 408 and closed. keep_alive_timeout:
    seconds an idle keep-alive connection is kept. max_connections: open connections; one more is answered 503
    and closed at once, and requests beyond it in flight get 503 (uvicorn's limit_concurrency).
    Several models (serve/pool.py): max_loaded_models: most models loaded at once; max_loaded_mb: most megabytes
    of model files loaded at once (0: no limit, for both); the least recently used are unloaded to make room.
    pivot: a language (`en`) to translate through when no model translates a pair directly (None: never).
    cache_size: translations kept in the translation cache, per text (0: no cache).
    """

    host: str = "127.0.0.1"
    port: int = 5000  # LibreTranslate's default port, so clients' defaults work
    max_batch_size: int = 16
    batch_window_ms: float = 10.0
    max_queue: int = 256
    timeout: float = 60.0
    max_chars: int = 5000
    max_texts: int = 64
    max_body_bytes: int = 1 << 20
    max_beams: int = 8
    max_request_cost: int = 65536
    max_batch_cost: int = 65536
    api_keys: tuple[str, ...] = ()
    protect_all: bool = False
    cors_origins: tuple[str, ...] = ()
    request_timeout: float = 30.0
    keep_alive_timeout: float = 5.0
    max_connections: int = 1000
    log_level: str = "info"
    access_log: bool = True
    max_loaded_models: int = 0
    max_loaded_mb: float = 0.0
    pivot: str | None = None
    cache_size: int = 10000

    def __post_init__(self) -> None:
        positive = (
            "max_batch_size",
            "max_queue",
            "max_chars",
            "max_texts",
            "max_body_bytes",
            "max_beams",
            "max_connections",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        non_negative = ("batch_window_ms", "timeout", "max_request_cost", "max_batch_cost")
        for name in (*non_negative, "max_loaded_models", "max_loaded_mb", "cache_size"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}")
        for name in ("request_timeout", "keep_alive_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.protect_all and not self.api_keys:
            raise ValueError("protect_all needs api_keys: without a key there is nothing to protect with")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0..65535, got {self.port}")
        if self.log_level not in LOG_LEVELS:
            raise ValueError(f"unknown log level {self.log_level!r}; valid: {', '.join(LOG_LEVELS)}")


def split_list(value: str | None) -> tuple[str, ...]:
    """`"a, b,,c"` -> `("a", "b", "c")`: how list settings (API keys, CORS origins) arrive from the environment."""
    return tuple(item.strip() for item in (value or "").split(",") if item.strip())
