"""The service: its state between requests, its start and stop, and the way one request goes through it (the
source detected, the route, the texts cut into units, prepared, their cost checked, from the cache or through the
model's batcher, the answer in LibreTranslate's shape). Request handlers in `app.py` call into one `Service`;
nothing here knows about HTTP routing.

Beside it: how its models are opened (serve/loading.py) and held (serve/pool.py: loaded on demand, one batcher
each), the routing of language pairs to them (serve/catalog.py), what a request may cost (serve/costs.py), what
/info and the listings say (serve/info.py), the keys and limits per key (serve/limits.py).

One model directory: it is loaded at start-up and the service is ready once it is (a model that cannot be loaded
stops the server). Several: their manifests are read at start-up (ready then), each model is loaded on its first
request."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from ..architectures import text_unit
from ..documents.translate import Counting, counting
from ..manifest import Manifest
from ..runtime.options import BatchLimits, CallOptions, DecodeOptions, RuntimeOptions
from ..runtime.search import names_no_length
from ..runtime.translator import Prepared, Translation, Translator, resolve_settings, text_cost
from . import units
from .batcher import Batcher, ClientGone, QueueFull
from .cache import TranslationCache
from .catalog import Catalog, Leg
from .costs import check_cost, smallest_request_limit
from .detect import Detected, Detector
from .downloads import Downloads
from .info import listings, service_info
from .limits import Quota
from .loading import Loader, holds_models, model_entry
from .metrics import Metrics
from .options import ServeOptions
from .pool import RETRY_AFTER, ModelPool, without_paths
from .protocol import ApiError, TranslateRequest
from .workers import DocumentWorkers

log = logging.getLogger("onnxmt.serve")


class Service:
    def __init__(
        self,
        model_dirs: str | Path | Sequence[str | Path],
        options: ServeOptions,
        runtime: RuntimeOptions,
        decoding: DecodeOptions,
    ) -> None:
        given = [model_dirs] if isinstance(model_dirs, (str, Path)) else list(model_dirs)
        if not given:
            raise ValueError("no model directory given")
        self.model_dirs = [Path(d) for d in given]
        self.options = options
        self.runtime = runtime
        self.decoding = decoding
        # Decoder batches are the service's to size, whatever the library default.
        self.batching = BatchLimits(options.max_batch_size, options.max_batch_cost or None)
        self.metrics = Metrics()
        self.cache = TranslationCache(options.cache_size, int(options.cache_mb * 2**20))
        self.limits = options.document_limits()
        self.workers = DocumentWorkers(options.document_workers, options.max_document_queue, options.document_worker_mb)
        self.downloads = Downloads(int(options.max_stored_mb * 2**20), options.keep_files_seconds)
        self.quota = Quota(options)  # keys of --key-db and the counts of --req-limit and the other limits per key
        # One inference thread for every model: ONNX Runtime parallelises inside a batch; two batches at once
        # would only compete for the same cores. Loads run there too, between batches. (Its thread starts with
        # the first load.)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="onnxmt-inference")
        self.loader = Loader(options, runtime, decoding, self.batching, self._executor, self.metrics)
        self.pool: ModelPool | None = None
        self.catalog: Catalog | None = None
        self.detector: Detector | None = None
        self.error: str | None = None  # why the service could not start
        self.public_error: str | None = None  # the same, as clients see it: no path on the server
        self.draining = False
        # Called when the models cannot be opened: the server stops and the command exits non-zero.
        self.on_fatal: Callable[[str], None] = lambda message: None
        self._opening: asyncio.Task[None] | None = None
        self._open = False
        self._listings: dict[str, bytes] = {}

    @property
    def ready(self) -> bool:
        return self._open and not self.draining

    async def start(self) -> None:
        """Start opening the models on the inference thread; the server answers /health meanwhile."""
        try:
            self.quota.open()  # --key-db created now, or the server stops saying why
        except (sqlite3.Error, OSError) as e:
            self.error = f"cannot open the key database {self.options.key_db}: {e}"
            log.error(self.error)
            self.on_fatal(self.error)
        self.workers.start()
        self.downloads.start()
        self._opening = asyncio.create_task(self._start(), name="onnxmt-load")

    async def opened(self) -> None:
        """Returns once the models are opened or could not be (`ready` and `error` then say which): what a Ray
        Serve replica's first health check waits for, so that no request reaches a replica still loading."""
        if self._opening is not None:
            await asyncio.shield(self._opening)

    async def _start(self) -> None:
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        where = ", ".join(str(d) for d in self.model_dirs)
        try:
            if len(self.model_dirs) == 1 and not holds_models(self.model_dirs[0]):
                directory = self.model_dirs[0]
                translator = await loop.run_in_executor(self._executor, self.loader.translator, directory)
                entries = [model_entry(directory, directory.name, translator.manifest)]
            else:
                translator = None
                entries = await loop.run_in_executor(self._executor, self.loader.read_entries, self.model_dirs)
            languages = [e.languages.model for e in entries]
            self.detector = await loop.run_in_executor(self._executor, Detector, languages)
        except Exception as e:  # ModelDirError, ValueError, OSError, onnxruntime's own errors: all fatal here
            self.error = f"cannot load the model from {where}: {e}"
            log.error(self.error)
            # /ready shows it until the server stops: without the server's paths.
            shown = str(e)
            for directory in self.model_dirs:
                shown = without_paths(shown, directory, directory.name)
            self.public_error = f"cannot load the model: {shown}"
            self.on_fatal(self.error)
            return
        self.pool = ModelPool(entries, self.loader)
        catalog = Catalog(entries, self.options.pivot)
        self._listings = await asyncio.to_thread(listings, catalog, self.options)  # off the event loop
        self.catalog = catalog
        if self.catalog.pivot and len(entries) > 1 and not self.catalog.through_pivot():
            log.warning(
                "--pivot %s: no two models translate into and out of it; no pair goes through it", self.catalog.pivot
            )
        if translator is not None:
            self.pool.adopt(entries[0], translator)
            if translator.capabilities.batch_invariant(self.options.max_batch_size) is False:
                log.info("%s", translator.capabilities.variant_batches)
        self._open = True
        self.metrics.ready.set(1)
        shown = "; ".join(f"{e.name}: {e.languages.source} → {', '.join(e.languages.targets)}" for e in entries)
        log.info("%d model(s) opened in %.1f s (%s); ready", len(entries), time.perf_counter() - started, shown)

    async def stop(self) -> None:
        """After the server has finished the requests in flight: stop the batch loops and the inference thread."""
        self.draining = True
        self.metrics.ready.set(0)
        if self._opening is not None and not self._opening.done():
            self._opening.cancel()
        if self.pool is not None:
            await self.pool.stop()
        self._executor.shutdown(wait=False, cancel_futures=True)
        self.workers.stop()
        self.downloads.close()
        self.quota.close()

    def require_ready(self) -> tuple[Catalog, ModelPool]:
        if self.draining:
            raise ApiError(503, "the service is shutting down", RETRY_AFTER)
        if not self._open or self.catalog is None or self.pool is None:
            raise ApiError(503, self.public_error or "the model is still loading", RETRY_AFTER)
        return self.catalog, self.pool

    async def translate(
        self,
        request: TranslateRequest,
        disconnected: Callable[[], Awaitable[object]] | None = None,
        ids: Sequence[Sequence[int]] | None = None,
        on_partial: Callable[[int, str], None] | None = None,
        *,
        cut: bool = False,
    ) -> dict[str, Any]:
        """Answer a checked /translate request in LibreTranslate's shape. `disconnected()` returns when the client
        has gone: the request's work is then cancelled. `ids`: the texts' source ids for the model that reads
        them first, where the caller has them (a document's sentences, counted when it was cut). `on_partial(text
        index, translation so far, its last token held back)`: told after each token a text generates, where its
        model's batcher tells tokens as they come (in flight, greedy; the last model of a pivot); not for texts
        found in the cache. `cut`: each text is first cut into the units of text of the model that reads it
        (serve/units.py), translated unit by unit and joined again."""
        catalog, _ = self.require_ready()
        detected, source = await self._source(catalog, request)
        route = catalog.route(source, request.target)
        if route.pivot is not None and (request.glossary or request.context is not None):
            raise ApiError(
                400,
                f"a glossary or context needs one model for the pair; {source} -> {request.target} goes through "
                f"{route.pivot}",
            )
        texts, results = request.texts, []
        layouts = None
        if cut:
            unit = self.options.text_unit or text_unit(route.legs[0].entry.manifest.architecture)
            layouts = await asyncio.to_thread(units.cut, texts, unit, source)
            texts = units.units(layouts)
            on_partial = None  # told by unit, not by text
        for i, leg in enumerate(route.legs):
            last = i == len(route.legs) - 1
            # Through a pivot, the first leg's best translation is the second's input: alternatives are the
            # second leg's.
            alternatives = request.alternatives if last else 0
            # The second leg of a pivot reads the pivot language, not the request's source.
            read = source if i == 0 else route.pivot
            given = ids if i == 0 else None
            partial = on_partial if last else None
            results = await self._leg(leg, texts, request, alternatives, disconnected, read, given, partial)
            texts = [r.text for r in results]
        if layouts is not None:
            results = units.joined(layouts, results)
        return _answer(request, results, detected, route.pivot)

    async def source_of(self, request: TranslateRequest) -> tuple[Detected | None, str | None]:
        """(the detected language to report, the source to route and translate by) of `request`'s texts."""
        catalog, _ = self.require_ready()
        return await self._source(catalog, request)

    async def counting(self, request: TranslateRequest) -> tuple[Counting, Callable[[int], int]]:
        """How the model that reads `request.source` (the first of a pivot's two) counts a sentence: its
        tokenizer decides where sentences too long for it are cut; and what a sentence of n tokens costs."""
        catalog, pool = self.require_ready()
        leg = catalog.route(request.source, request.target).legs[0]
        async with pool.use(leg.entry) as (translator, _):
            try:
                source = translator.source_code(request.source)
                settings = resolve_settings(translator.manifest, self._decoding(translator, request, 0))
                unit = self.options.text_unit
                where = counting(
                    translator, source, leg.target_lang, unit=unit, glossary=request.glossary, context=request.context
                )
            except ValueError as e:
                raise ApiError(400, str(e)) from e
        return where, partial(text_cost, settings=settings)

    async def _source(self, catalog: Catalog, request: TranslateRequest) -> tuple[Detected | None, str | None]:
        """(the detected language to report, the source to route and translate by). A named source is taken as it
        is; for `auto` (or none), the detected language of the texts together (one answer for a batch, as
        LibreTranslate gives), which must be a source the service has: 400 otherwise, unless the texts have nothing
        to tell a language by (REFUSE_CONFIDENCE, MIN_LETTERS). A model that reads many languages (NLLB) is told
        the detected one."""
        if request.source not in (None, "", "auto"):
            return None, request.source
        sources = catalog.sources()
        text = "\n".join(t for t in request.texts if t.strip())
        if not text or not sources:
            if catalog.single:
                source = catalog.entries[0].languages.source  # the model's default
                return (Detected(source, 0.0) if source else None), request.source
            # Nothing to detect: the first source that reaches the target (empty texts translate to empty texts).
            source = next((s for s in sources if catalog.reaches(s, request.target)), sources[0])
            return Detected(source, 0.0), source
        candidates = await self.detect(text)
        best = candidates[0]
        if best.language in sources:
            return best, best.language
        if best.confidence >= REFUSE_CONFIDENCE and _letters(text, MIN_LETTERS) >= MIN_LETTERS:
            where = "this model translates from" if catalog.single else "this server translates from"
            raise ApiError(
                400,
                f"the text is in {best.language} (detected, {best.confidence:g}% confident); "
                f"{where} {', '.join(sources)}",
            )
        # Nothing to tell a language by ("C++", "12345", emoji): translated from the likeliest source that reaches
        # the target, its confidence reported as it was (LibreTranslate answers such texts the same way).
        if catalog.single:
            source = catalog.entries[0].languages.source
            found = next((c for c in candidates if c.language == source), None)
            return ((found or Detected(source, 0.0)) if source else None), request.source
        reaching = [s for s in sources if catalog.reaches(s, request.target)] or sources
        found = next((c for c in candidates if c.language in reaching), None)
        return (found or Detected(reaching[0], 0.0)), (found.language if found else reaching[0])

    async def _leg(
        self,
        leg: Leg,
        texts: list[str],
        request: TranslateRequest,
        alternatives: int,
        disconnected: Callable[[], Awaitable[object]] | None,
        source: str | None,
        ids: Sequence[Sequence[int]] | None = None,
        on_partial: Callable[[int, str], None] | None = None,
    ) -> list[Translation]:
        """`texts` translated by one model: prepared once (tokenized, checked, costed), then from the cache where
        it has them, the others through its batcher. `source`: the language this model reads (the request's, or
        the pivot's)."""
        _, pool = self.require_ready()
        entry = leg.entry
        async with pool.use(entry) as (translator, batcher):
            prepared = await self._prepare(translator, leg, texts, request, alternatives, source, ids)
            if not prepared:
                return []
            check_cost(prepared, entry.manifest, self.options)
            if not self.cache.size:
                return await self._queue(batcher, prepared, disconnected, _partials(translator, on_partial))
            found = [self.cache.get((entry.name, p)) for p in prepared]
            missing = list(dict.fromkeys(p for p, hit in zip(prepared, found, strict=True) if hit is None))
            hits = len(prepared) - sum(hit is None for hit in found)
            self.metrics.observe_cache(entry.name, hits, len(prepared) - hits, len(self.cache))
            made: dict[Prepared, Translation] = {}
            if missing:
                where = {p: [i for i, q in enumerate(prepared) if q == p] for p in missing}
                told = _partials(translator, on_partial, [where[p] for p in missing])
                made = dict(zip(missing, await self._queue(batcher, missing, disconnected, told), strict=True))
                for p, translation in made.items():
                    self.cache.put((entry.name, p), translation)
                self.metrics.cache_entries.set(len(self.cache))
            return [hit if hit is not None else made[p] for p, hit in zip(prepared, found, strict=True)]

    async def _prepare(
        self,
        translator: Translator,
        leg: Leg,
        texts: list[str],
        request: TranslateRequest,
        alternatives: int,
        source: str | None,
        ids: Sequence[Sequence[int]] | None,
    ) -> list[Prepared]:
        """The request's texts prepared for this model, once: a bad option or language is a 400 before anything
        is queued. Tokenizing is done off the event loop (64 texts of 5,000 characters take a second) and off the
        inference thread."""
        try:
            call = self._call(translator, leg, source, request, alternatives)
            translator.prompts(1, call)  # checked even when there is no text
            return await asyncio.to_thread(partial(translator.prepare, texts, call, ids=ids))
        except ValueError as e:
            raise ApiError(400, str(e)) from e

    async def _queue(
        self,
        batcher: Batcher,
        prepared: list[Prepared],
        disconnected: Callable[[], Awaitable[object]] | None,
        on_token: Callable[[int, int], None] | None = None,
    ) -> list[Translation]:
        timeout = self.options.timeout or None
        try:
            return await batcher.translate(prepared, timeout, disconnected=disconnected, on_token=on_token)
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

    async def detect(self, text: str) -> list[Detected]:
        """Candidates for `text`'s language, most confident first; off the event loop and the inference thread."""
        self.require_ready()
        assert self.detector is not None
        return await asyncio.to_thread(self.detector.detect, text)

    def _call(
        self, translator: Translator, leg: Leg, source: str | None, request: TranslateRequest, alternatives: int
    ) -> CallOptions:
        """What this model is told for the request's texts: the language pair (models told their source by a token,
        NLLB and M2M100, take the request's, "auto" the model's default; ValueError for one it does not read), the
        request's glossary and context, and its decoding settings."""
        decoding = self._decoding(translator, request, alternatives)
        return CallOptions(translator.source_code(source), leg.target_lang, request.glossary, request.context, decoding)

    def _decoding(self, translator: Translator, request: TranslateRequest, alternatives: int) -> DecodeOptions:
        """The request's decoding settings over the service's."""
        beams = request.beams or self.decoding.beams
        returned = alternatives + 1
        if alternatives:
            # LibreTranslate's alternatives are the runner-up beams: widen the beam when it is too narrow.
            beams = max(beams or translator.manifest.generation.get("num_beams") or 1, returned)
        max_new = request.max_new_tokens or self._fallback_length(translator.manifest) or self.decoding.max_new_tokens
        return replace(self.decoding, beams=beams, max_new_tokens=max_new, num_return_sequences=returned)

    def _fallback_length(self, manifest: Manifest) -> int | None:
        """--fallback-max-new-tokens (at most the model's positions) for a model whose configs name no length,
        when the service names none either; else None (the model's or the service's own length)."""
        own = self.decoding.max_new_tokens is not None or self.decoding.max_length is not None
        if own or not names_no_length(manifest) or not self.options.fallback_max_new_tokens:
            return None
        return min(self.options.fallback_max_new_tokens, int(manifest.model["max_positions"]))

    def smallest_request_limit(self) -> int | None:
        """The lowest request limit of the models (what a document's requests are cut by)."""
        catalog, _ = self.require_ready()
        return smallest_request_limit((e.manifest for e in catalog.entries), self.options)

    def info(self) -> dict[str, Any]:
        catalog, pool = self.require_ready()
        return service_info(catalog, pool, self.options, self.decoding, self.cache, keys_on=self.quota.keys_on())

    def libretranslate_languages(self) -> list[dict[str, Any]]:
        catalog, _ = self.require_ready()
        return catalog.libretranslate()

    def listing(self, name: str) -> bytes:
        """The JSON of `/languages` ("languages") or `/frontend/settings` ("frontend"), made at start-up."""
        self.require_ready()
        return self._listings[name]


# `source: auto` refuses a text detected in a language no model reads only when the detector is this sure (in %) and
# the text has this many letters: below, there is nothing to tell a language by, and the text is translated.
REFUSE_CONFIDENCE = 90.0
MIN_LETTERS = 3


def _letters(text: str, enough: int) -> int:
    """How many letters `text` has, counted up to `enough`."""
    count = 0
    for char in text:
        count += char.isalpha()
        if count >= enough:
            break
    return count


def _partials(
    translator: Translator,
    on_partial: Callable[[int, str], None] | None,
    positions: Sequence[Sequence[int]] | None = None,
) -> Callable[[int, int], None] | None:
    """A batcher's token listener that tells `on_partial` each text's translation so far, its last token held back
    (the next may join it into one word, as `onnxmt.documents.translate_stream` holds it): the text queued as j is
    the request's texts `positions[j]` (the same text asked twice is queued once; default: j itself)."""
    if on_partial is None:
        return None
    tokens: dict[int, list[int]] = {}

    def told(j: int, token: int) -> None:
        so_far = tokens.setdefault(j, [])
        so_far.append(token)
        text = translator.detokenize(so_far[:-1])
        for i in positions[j] if positions is not None else (j,):
            on_partial(i, text)

    return told


def _answer(
    request: TranslateRequest, results: list[Translation], detected: Detected | None, pivot: str | None = None
) -> dict[str, Any]:
    texts = [r.text for r in results]
    body: dict[str, Any] = {"translatedText": texts if request.batch else texts[0]}
    if request.alternatives:
        alternatives = [[a.text for a in r.alternatives] for r in results]
        body["alternatives"] = alternatives if request.batch else alternatives[0]
    if detected is not None:
        shown = detected.libretranslate()
        body["detectedLanguage"] = [shown] * len(results) if request.batch else shown
    if pivot is not None:
        body["pivot"] = pivot  # translated through this language: two models, two translations
    return body
