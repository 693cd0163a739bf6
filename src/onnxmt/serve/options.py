"""`ServeOptions`: the service's settings, shared by the CLI (`onnxmt serve`, flags default from `ONNXMT_*`) and
the app factory."""

from __future__ import annotations

from dataclasses import dataclass

from ..architectures import TEXT_UNITS
from ..documents.limits import DEFAULT_LIMITS, DocumentLimits
from ..options import check, option

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")  # uvicorn's


@dataclass(frozen=True)
class ServeOptions:
    """How the service listens, batches and limits; each field's help says what it does (`onnxmt serve --help`).
    Two limits of 0 mean none: max_request_cost and max_batch_cost (tokens x beams: Translator.cost's source
    tokens + max new tokens, times beams, summed over the texts)."""

    host: str = option("127.0.0.1", help="Address to listen on.")
    port: int = option(5000, help="Port to listen on.", min=0, max=65535)  # LibreTranslate's, so clients' defaults work
    # In flight, a request that finds the running batch full waits for a text to leave it: 32 lets 16 long requests
    # run while short ones still join at the next step (rows cost step time, not waiting: docs/benchmarks.md).
    max_batch_size: int = option(32, help="Most texts in the running decoder batch.", min=1)
    # A short window trades a little latency at low load for much throughput at high load.
    batch_window_ms: float = option(
        10.0, help="Static batches (decoders before format 4): how long a request waits for others.", min=0
    )
    # Beyond the running batch; so memory and latency stay bounded under overload.
    max_queue: int = option(256, help="Requests that may wait; more get 503 + Retry-After.", min=1)
    timeout: float = option(60.0, help="Seconds a request may wait and run (0: no limit).", min=0)
    max_chars: int = option(5000, help="Most characters per text.", min=1)
    max_texts: int = option(64, help="Most texts per request.", min=1)
    max_body_bytes: int = option(1 << 20, help="Largest request body; larger get 413.", min=1)
    max_beams: int = option(8, help="Largest beam a request may ask for.", min=1)
    # The unit of text is the model's family's (architectures `text_unit`, docs/decoder-only.md): sentence-level
    # models get sentences, as LibreTranslate gives Argos; document-level ones a paragraph whole.
    text_unit: str | None = option(
        None,
        help="Cut each text of /translate, documents and streams into sentences, or into paragraphs (lines), before "
        "translating (default: the model's family's: sentence for encoder-decoder models, paragraph for "
        "decoder-only translators).",
        choices=TEXT_UNITS,
    )
    # A request's glossary and context go into every one of its texts' prompts (HY-MT's terminology and context
    # prompts), so their sizes bound each prompt's.
    max_glossary_terms: int = option(100, help="Most (source, target) pairs in a request's glossary.", min=0)
    max_glossary_chars: int = option(5000, help="Most characters of a request's glossary, all its terms.", min=0)
    max_context_chars: int = option(2000, help="Most characters of a request's context.", min=0)
    # transformers stops a model whose configs name no length at 20 new tokens, mid-sentence for most sentences;
    # 256 is CTranslate2's default decoding length. Capped by the model's positions.
    fallback_max_new_tokens: int = option(
        256,
        help="Most new tokens for a model whose configs name no length (MADLAD-400, mT5), instead of transformers' "
        "20; --max-new-tokens and a request's max_new_tokens come first (0: transformers' 20).",
        min=0,
    )
    max_request_cost: int = option(
        65536,
        help="Most tokens x beams per request ((source + max new tokens) x beams, summed); more get 413 (0: none).",
        min=0,
    )
    max_batch_cost: int = option(
        65536, help="Most tokens x beams in the running decoder batch: bounds memory (0: none).", min=0
    )
    # Admission is fair (runtime/scheduler.py): a waiting request that does not fit yet is passed by later ones
    # that do, for at most this long, so that a big request cannot be starved by a stream of small ones.
    # A one-text request beside a 64-text one starts at the next step, without taking a running text's place (whose
    # work would be lost): it takes one of these.
    reserved_texts: int | None = option(
        None,
        help="In flight: places past --max-batch-size kept for requests holding less than their share while another "
        "holds more (default: an eighth of --max-batch-size, at least 1).",
        min=0,
    )
    max_skip_ms: float = option(
        2000.0,
        help="In flight: how long a request with nothing running may be passed by later ones that fit before it; "
        "after that, nothing is admitted past it.",
        min=0,
    )
    # One token x beam holds K and V in every decoder layer: 24 KB in opus-mt, 384 KB in NLLB-200-3.3B, 512 KB in
    # MADLAD-400-3B. 65,536 tokens x beams are 1.5 GB of caches in the first and 24-32 GB in the last two.
    max_cache_mb: float = option(
        4096.0,
        help="Most MB of attention caches (K and V in every decoder layer, fp32) a model's running batch, the texts "
        "encoded ahead of their place, or one request may hold: caps --max-batch-cost and --max-request-cost for "
        "each model by its cache bytes per token "
        "x beam, given in /info (0: no cap).",
        min=0,
    )
    api_keys: tuple[str, ...] = option((), help="Comma-separated API keys; when set, /translate needs one.")
    protect_all: bool = option(False, help="Every endpoint but /health and /ready needs a key too.")
    # Limits per key (per client address without one), as LibreTranslate's: policy rather than safety (the sizes
    # above bound what one request costs), so none by default, as LibreTranslate has none (serve/limits.py).
    req_limit: int = option(
        0,
        help="Requests per --limit-window (a minute) per API key, or per client address without one, on the "
        "translating endpoints; more get 429 + Retry-After (0: no limit).",
        min=0,
    )
    char_limit: int = option(
        0, help="Most characters per request (all its texts); more get 400 (0: --max-chars per text only).", min=0
    )
    daily_char_limit: int = option(
        0, help="Characters per API key (or client address) and day (UTC); more get 429 (0: no limit).", min=0
    )
    limit_window: float = option(60.0, help="Seconds of the --req-limit window.", above=0)
    key_db: str | None = option(
        None,
        help="SQLite database of API keys (with limits of their own) and of the counts, created on first start; "
        "`onnxmt keys` manages it. Without it the counts are the process's own and lost on exit.",
    )
    cors_origins: tuple[str, ...] = option((), help="Comma-separated origins allowed from browsers, or *.")
    # Slow clients. Counted from the moment the connection opened or, on a kept-alive connection, from the
    # request's first byte; the connection is then answered 408 and closed.
    request_timeout: float = option(30.0, help="Seconds a client may take to send a whole request; then 408.", above=0)
    keep_alive_timeout: float = option(5.0, help="Seconds an idle keep-alive connection is kept.", above=0)
    # Requests beyond it in flight get 503 too (uvicorn's limit_concurrency).
    max_connections: int = option(1000, help="Open connections; more are answered 503 and closed.", min=1)
    log_level: str = option("info", help="debug, info, warning or error.", choices=LOG_LEVELS, parse=str.lower)
    access_log: bool = option(True, help="Log every request.")
    # Several models (serve/pool.py).
    max_loaded_models: int = option(
        0,
        help="Most models loaded at once; the least recently used is unloaded to load another (0: no limit).",
        min=0,
    )
    max_loaded_mb: float = option(
        0.0,
        help="Most megabytes of model files loaded at once, least recently used unloaded first (0: no limit).",
        min=0,
    )
    # A model that fails to load (a corrupted file) is not hashed again at every request for it.
    load_retry_seconds: float = option(
        30.0,
        help="Seconds before a model that failed to load is tried again; its requests get 503 + Retry-After "
        "meanwhile (0: at the next request).",
        min=0,
    )
    pivot: str | None = option(
        None,
        help="Translate through this language (e.g. en) when no model translates a pair directly; the answer "
        'says so ("pivot": "en").',
    )
    # The translation cache: per text; its bytes count texts, translations and token ids.
    cache_size: int = option(10000, help="Translations kept in the translation cache (0: no cache).", min=0)
    cache_mb: float = option(
        64.0, help="Most megabytes the translation cache takes; least recently used dropped first (0: no limit).", min=0
    )
    # Documents (/translate_file, format html, /translate/stream; docs/documents.md). A document is translated in
    # requests under max_request_cost each, its sentences limited to max_chars as texts are; the bounds the library
    # has too default to its own (documents/limits.py).
    max_document_cost: int = option(
        1 << 22, help="Most tokens x beams one document (file, html, stream) may cost in all; more get 413.", min=1
    )
    max_document_sentences: int = option(
        DEFAULT_LIMITS.max_sentences, help="Most sentences per document; more get 413.", min=1
    )
    max_document_texts: int = option(
        DEFAULT_LIMITS.max_texts,
        help="Most blocks of text (paragraphs, cues, cells) per document; more get 413.",
        min=1,
    )
    max_document_unpacked_mb: float = option(
        DEFAULT_LIMITS.max_unpacked_bytes / 2**20, help="Most megabytes a .docx may expand to; more get 413.", above=0
    )
    max_document_ratio: float = option(  # DocumentLimits checks it (at least 1)
        DEFAULT_LIMITS.max_ratio, help="Most a .docx's zip member may expand (uncompressed / compressed); more get 413."
    )
    max_document_xml_elements: int = option(
        DEFAULT_LIMITS.max_xml_elements,
        help="Most XML nodes (elements, attributes, comments) in a .docx; more get 413.",
        min=1,
    )
    # Each step of a document in a worker runs within `timeout`.
    document_workers: int = option(1, help="Processes that read and write documents, each one at a time.", min=1)
    document_worker_mb: int = option(
        4096,
        help="Address space of a document worker, in MB; a document needing more gets 413 (0: no limit).",
        min=0,
    )
    max_document_queue: int = option(
        16, help="Documents that may wait for a worker; more get 503 + Retry-After.", min=1
    )
    max_stored_mb: float = option(
        256.0, help="Most megabytes of translated files kept for download; the oldest go first.", above=0
    )
    keep_files_seconds: float = option(3600.0, help="Seconds a translated file is kept for download.", above=0)
    public_url: str | None = option(  # e.g. https://translate.example.com
        None, help="The service's address as clients reach it, for translatedFileUrl (default: the request's)."
    )
    forwarded_allow_ips: str | None = option(
        None, help='Proxies whose X-Forwarded-For/-Proto are trusted: addresses, comma-separated, or "*".'
    )

    def __post_init__(self) -> None:
        check(self)
        if self.protect_all and not self.api_keys and self.key_db is None:
            raise ValueError("protect_all needs api_keys or key_db: without a key there is nothing to protect with")
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
            max_tokens=self.max_document_cost,
        )
