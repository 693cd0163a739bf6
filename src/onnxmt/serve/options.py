"""`ServeOptions`: the service's settings, shared by the CLI (`onnxmt serve`, flags default from `ONNXMT_*`) and
the app factory."""

from __future__ import annotations

from dataclasses import dataclass

from ..documents.limits import DocumentLimits

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
    cache_size: translations kept in the translation cache, per text (0: no cache); cache_mb: most megabytes they
    take (texts, translations, token ids), the least recently used dropped first.
    Documents (/translate_file, format html, /translate/stream; docs/documents.md): max_document_cost: most tokens x
    beams one document may cost in all (413 above it; it is translated in requests under max_request_cost each).
    max_document_sentences, max_document_texts: sentences and blocks of text (paragraphs, cues, cells) per document;
    max_document_unpacked_mb, max_document_ratio, max_document_xml_elements: a .docx's size after decompression, the
    most a zip member may expand, its XML nodes. A document's sentences are limited to max_chars, as texts are.
    Documents are read and written in document_workers processes of document_worker_mb of address space each (0:
    no limit), each step within `timeout`; max_document_queue documents may wait for one (more get 503).
    Translated files: max_stored_mb megabytes of them kept (the oldest removed first), each keep_files_seconds.
    public_url: the service's address as clients reach it (https://translate.example.com), for translatedFileUrl;
    None: the request's own. forwarded_allow_ips: proxies whose X-Forwarded-For/-Proto headers are trusted
    (comma-separated addresses, "*" for any; None: none).
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
    cache_mb: float = 64.0
    max_document_cost: int = 1 << 22
    max_document_sentences: int = 50_000
    max_document_texts: int = 50_000
    max_document_unpacked_mb: float = 64.0
    max_document_ratio: float = 200.0
    max_document_xml_elements: int = 500_000
    document_workers: int = 1
    document_worker_mb: int = 4096
    max_document_queue: int = 16
    max_stored_mb: float = 256.0
    keep_files_seconds: float = 3600.0
    public_url: str | None = None
    forwarded_allow_ips: str | None = None

    def __post_init__(self) -> None:
        positive = (
            "max_batch_size",
            "max_queue",
            "max_chars",
            "max_texts",
            "max_body_bytes",
            "max_beams",
            "max_connections",
            "max_document_cost",
            "max_document_sentences",
            "max_document_texts",
            "max_document_xml_elements",
            "document_workers",
            "max_document_queue",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        non_negative = ("batch_window_ms", "timeout", "max_request_cost", "max_batch_cost")
        for name in (
            *non_negative,
            "max_loaded_models",
            "max_loaded_mb",
            "cache_size",
            "cache_mb",
            "document_worker_mb",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}")
        for name in (
            "request_timeout",
            "keep_alive_timeout",
            "max_document_unpacked_mb",
            "max_stored_mb",
            "keep_files_seconds",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.protect_all and not self.api_keys:
            raise ValueError("protect_all needs api_keys: without a key there is nothing to protect with")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0..65535, got {self.port}")
        if self.log_level not in LOG_LEVELS:
            raise ValueError(f"unknown log level {self.log_level!r}; valid: {', '.join(LOG_LEVELS)}")
        if self.public_url is not None and not self.public_url.startswith(("http://", "https://")):
            raise ValueError(f"public_url must start with http:// or https://, got {self.public_url!r}")
        self.document_limits()  # its own checks (max_document_ratio at least 1)

    def document_limits(self) -> DocumentLimits:
        return DocumentLimits(
            max_unpacked_bytes=int(self.max_document_unpacked_mb * 2**20),
            max_ratio=self.max_document_ratio,
            max_xml_elements=self.max_document_xml_elements,
            max_texts=self.max_document_texts,
            max_sentences=self.max_document_sentences,
            max_sentence_chars=self.max_chars,
        )


def split_list(value: str | None) -> tuple[str, ...]:
    """`"a, b,,c"` -> `("a", "b", "c")`: how list settings (API keys, CORS origins) arrive from the environment."""
    return tuple(item.strip() for item in (value or "").split(",") if item.strip())
