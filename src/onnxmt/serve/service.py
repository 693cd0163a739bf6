"""The service's state between requests: the translator (loaded after start-up, off the event loop), the batcher
and the metrics. Request handlers in `app.py` call into one `Service`; nothing here knows about HTTP routing."""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .. import __version__
from ..runtime.cancel import CancelToken
from ..runtime.invariance import activation_scales
from ..runtime.options import DecodeOptions, RuntimeOptions
from ..runtime.translator import Translation, Translator, resolve_settings
from .batcher import ClientGone, MicroBatcher, QueueFull
from .detect import Detected, Detector
from .metrics import Metrics
from .options import ServeOptions
from .protocol import ApiError, Languages, TranslateRequest

log = logging.getLogger("onnxmt.serve")

RETRY_AFTER = {"Retry-After": "1"}


class Service:
    def __init__(
        self, model_dir: str | Path, options: ServeOptions, runtime: RuntimeOptions, decoding: DecodeOptions
    ) -> None:
        self.model_dir = Path(model_dir)
        self.options = options
        self.runtime = runtime
        # Decoder batches are the service's to size, whatever the library default.
        self.decoding = decoding.merged(
            batch_size=options.max_batch_size, max_batch_cost=options.max_batch_cost or None
        )
        self.metrics = Metrics()
        self.translator: Translator | None = None
        self.languages: Languages | None = None
        self.detector: Detector | None = None
        self.error: str | None = None  # why the model could not be loaded
        self.draining = False
        # Called when the model cannot be loaded: the server stops and the command exits non-zero.
        self.on_fatal: Callable[[str], None] = lambda message: None
        self._executor: ThreadPoolExecutor | None = None
        self._batcher: MicroBatcher | None = None
        self._loading: asyncio.Task[None] | None = None

    @property
    def ready(self) -> bool:
        return self.translator is not None and not self.draining

    async def start(self) -> None:
        """Start loading the model on the inference thread; the server answers /health meanwhile."""
        # One inference thread: ONNX Runtime parallelises inside a batch; two batches at once would only compete
        # for the same cores.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="onnxmt-inference")
        self._batcher = MicroBatcher(
            self._translate,
            self._executor,
            max_batch_size=self.options.max_batch_size,
            window=self.options.batch_window_ms / 1000,
            max_queue=self.options.max_queue,
            max_batch_cost=self.options.max_batch_cost or None,
            on_queue=self.metrics.queue_depth.set,
            on_batch=self.metrics.observe_batch,
        )
        self._loading = asyncio.create_task(self._load(), name="onnxmt-load")

    async def _load(self) -> None:
        assert self._executor is not None and self._batcher is not None
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        try:
            translator = await loop.run_in_executor(
                self._executor, Translator, self.model_dir, self.runtime, self.decoding
            )
            languages = Languages(translator.manifest)
            self.detector = await loop.run_in_executor(self._executor, Detector, languages.model)
        except Exception as e:  # ModelDirError, ValueError, OSError, onnxruntime's own errors: all fatal here
            self.error = f"cannot load the model from {self.model_dir}: {e}"
            log.error(self.error)
            self.on_fatal(self.error)
            return
        self.translator = translator
        self.languages = languages
        self._batcher.start()
        self.metrics.ready.set(1)
        variant = translator.manifest.provenance.get("variant")  # Optimum/Transformers.js directories
        shown = f" (variant {variant})" if variant else ""
        log.info("model %s%s loaded in %.1f s; ready", self.model_dir, shown, time.perf_counter() - started)
        if self.batch_invariant() is False:
            log.info(
                "int8 with per-tensor activation scales: a text's translation can depend on the requests it is "
                "batched with (docs/serve.md); `onnxmt quantize --per-row-scales` makes it independent"
            )

    def batch_invariant(self) -> bool | None:
        """Whether a text's translation is independent of what it is batched with; None: cannot tell (an Optimum
        directory's quantization is not recorded)."""
        if self.translator is None:
            return None
        manifest = self.translator.manifest
        if self.options.max_batch_size == 1 or activation_scales(manifest) == "per row":
            return True
        if manifest.layout != "onnxmt":
            return None
        return activation_scales(manifest) is None  # fp32, int4 (weight-only): yes; per-tensor int8: no

    async def stop(self) -> None:
        """After the server has finished the requests in flight: stop the batch loop and the inference thread."""
        self.draining = True
        self.metrics.ready.set(0)
        if self._loading is not None and not self._loading.done():
            self._loading.cancel()
        if self._batcher is not None:
            await self._batcher.stop()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    def check_key(self, api_key: object) -> None:
        keys = self.options.api_keys
        if not keys:
            return
        if not isinstance(api_key, str) or not api_key:
            raise ApiError(403, "Invalid API key: this server needs an api_key")
        # compare_digest on every key: the time taken does not reveal how much of a key matched.
        # surrogatepass: a key with a lone surrogate (possible in JSON) is a wrong key, not an encoding error.
        given = api_key.encode("utf-8", "surrogatepass")
        if not any(hmac.compare_digest(given, key.encode()) for key in keys):
            raise ApiError(403, "Invalid API key")

    def _require_ready(self) -> tuple[Translator, Languages, MicroBatcher]:
        if self.draining:
            raise ApiError(503, "the service is shutting down", RETRY_AFTER)
        if self.translator is None or self.languages is None or self._batcher is None:
            raise ApiError(503, self.error or "the model is still loading", RETRY_AFTER)
        return self.translator, self.languages, self._batcher

    async def translate(
        self, request: TranslateRequest, disconnected: Callable[[], Awaitable[object]] | None = None
    ) -> dict[str, Any]:
        """Answer a checked /translate request in LibreTranslate's shape. `disconnected()` returns when the client
        has gone: the request's work is then cancelled."""
        translator, languages, batcher = self._require_ready()
        detected = await self._check_source(languages, request)
        options = self._decode_options(translator, languages, request)
        timeout = self.options.timeout or None
        if not request.texts:
            return _answer(request, [], detected)
        cost = self._check_cost(translator, request.texts, options)
        try:
            results = await batcher.translate(request.texts, options, timeout, cost=cost, disconnected=disconnected)
        except QueueFull as e:
            raise ApiError(503, f"server busy: {e}; retry later", RETRY_AFTER) from e
        except ClientGone as e:
            raise ApiError(499, "the client disconnected; the translation was cancelled") from e
        except asyncio.TimeoutError as e:
            if self.draining:  # another replica may have the time this one had not
                raise ApiError(503, "the service is shutting down", RETRY_AFTER) from e
            raise ApiError(504, f"translation timed out after {self.options.timeout:g} s") from e
        except ValueError as e:
            raise ApiError(400, str(e)) from e
        return _answer(request, results, detected)

    async def _check_source(self, languages: Languages, request: TranslateRequest) -> Detected | None:
        """400 for a source the model does not translate from; for `auto` (or none), the detected language of the
        texts together (one answer for a batch, as LibreTranslate gives), which must be the model's source."""
        if request.source not in (None, "", "auto"):
            languages.check_source(request.source)
            return None
        text = "\n".join(t for t in request.texts if t.strip())
        if not text or languages.source is None:
            return Detected(languages.source, 0.0) if languages.source else None
        best = (await self.detect(text))[0]
        if best.language != languages.source:
            raise ApiError(
                400,
                f"the text is in {best.language} (detected, {best.confidence:g}% confident); "
                f"this model translates from {languages.source}",
            )
        return best

    async def detect(self, text: str) -> list[Detected]:
        """Candidates for `text`'s language, most confident first; off the event loop and the inference thread."""
        self._require_ready()
        assert self.detector is not None
        return await asyncio.to_thread(self.detector.detect, text)

    def _decode_options(self, translator: Translator, languages: Languages, request: TranslateRequest) -> DecodeOptions:
        """The request's decoding settings, checked before queueing so a bad value is a 400, not a failed batch."""
        beams = request.beams
        returned = request.alternatives + 1
        if request.alternatives:
            # LibreTranslate's alternatives are the runner-up beams: widen the beam when it is too narrow.
            default_beams = self.decoding.beams or translator.manifest.generation.get("num_beams") or 1
            beams = max(beams or default_beams, returned)
        options = self.decoding.merged(
            beams=beams,
            max_new_tokens=request.max_new_tokens,
            target_lang=languages.target_lang(request.target),
            num_return_sequences=returned,
        )
        try:
            # Models told their source by a token (NLLB, M2M100) take the request's; "auto" is the model's default.
            options = options.merged(source_lang=translator.source_code(request.source))
            resolve_settings(translator.manifest, options)
            translator.prompt(options.source_lang, options.target_lang)
        except ValueError as e:
            raise ApiError(400, str(e)) from e
        return options

    def _check_cost(self, translator: Translator, texts: list[str], options: DecodeOptions) -> int:
        """The request's cost in tokens x beams; ApiError 413 above --max-request-cost."""
        cost = translator.cost(texts, **asdict(options))
        limit = self.options.max_request_cost
        if limit and cost > limit:
            settings = resolve_settings(translator.manifest, options)
            raise ApiError(
                413,
                f"request too large: it costs {cost} tokens x beams ((source tokens + {settings.max_length - 1} "
                f"new tokens) x {settings.num_beams} beams, over {len(texts)} texts); the limit is {limit} "
                "(max_request_cost): send fewer or shorter texts, fewer beams or a lower max_new_tokens",
            )
        return cost

    def _translate(self, texts: list[str], options: DecodeOptions, tokens: list[CancelToken]) -> list[Translation]:
        """Runs on the inference thread."""
        assert self.translator is not None
        return self.translator.translate(texts, cancel=tokens, **asdict(options))

    def info(self) -> dict[str, Any]:
        translator, languages, _ = self._require_ready()
        manifest, o = translator.manifest, self.options
        return {
            "version": __version__,
            "model": {
                # Names, never the server's paths: a model exported from a local directory records its path.
                "directory": self.model_dir.name,
                "architecture": manifest.architecture,
                "layout": manifest.layout,
                "source_model": _public_name(manifest.provenance.get("source_model")),
                "revision": manifest.provenance.get("revision"),
                "quantization": manifest.quantization,
                "variant": manifest.provenance.get("variant"),
                "bytes": sum(int(f.get("bytes") or 0) for f in manifest.files.values()),
                "model": manifest.model,
                "generation": manifest.generation,
            },
            "languages": {"source": languages.source, "targets": languages.targets, "default": languages.target},
            "decoding": {k: v for k, v in vars(self.decoding).items() if v is not None},
            "batching": {
                "max_batch_size": o.max_batch_size,
                "batch_window_ms": o.batch_window_ms,
                "max_queue": o.max_queue,
                "batch_invariant": self.batch_invariant(),
            },
            "limits": {
                "max_chars": o.max_chars,
                "max_texts": o.max_texts,
                "max_body_bytes": o.max_body_bytes,
                "max_beams": o.max_beams,
                "max_request_cost": o.max_request_cost,
                "max_batch_cost": o.max_batch_cost,
                "timeout": o.timeout,
            },
            "api_keys": bool(o.api_keys),
            "protect_all": o.protect_all,
        }

    def libretranslate_languages(self) -> list[dict[str, Any]]:
        _, languages, _ = self._require_ready()
        return languages.libretranslate()


def _public_name(source: object) -> str | None:
    """A hub id as it is ("Helsinki-NLP/opus-mt-en-zh"); a local path only by its last part."""
    if not isinstance(source, str):
        return None
    if source.startswith(("/", ".", "~")) or "\\" in source or source.count("/") > 1 or Path(source).exists():
        return Path(source).name
    return source


def _answer(request: TranslateRequest, results: list[Translation], detected: Detected | None) -> dict[str, Any]:
    texts = [r.text for r in results]
    body: dict[str, Any] = {"translatedText": texts if request.batch else texts[0]}
    if request.alternatives:
        alternatives = [[a.text for a in r.alternatives] for r in results]
        body["alternatives"] = alternatives if request.batch else alternatives[0]
    if detected is not None:
        shown = detected.libretranslate()
        body["detectedLanguage"] = [shown] * len(results) if request.batch else shown
    return body
