"""The models of one service: what each translates (from its manifest, read at start-up), and which are loaded.

A model is loaded on the first request that needs it, on the inference thread, and gets its own batcher (requests
for two models never share a decoder batch: they are different graphs). A budget bounds how many are loaded at
once (`max_models`) and their size (`max_bytes`, the model files' size on disk: ONNX Runtime's memory for the
weights is about that, its arenas come on top); to load one more, the least recently used models are unloaded,
each once its requests in flight are answered (its batcher drained), never in the middle of one.

Loads and unloads run one at a time (a lock), as a task of the pool's own: a request that gives up waiting (its
client gone) does not cancel a load other requests wait for.

A load starts with the directory's checks (`check`: its files' sha256 among them, ~1 s a GB) on a thread of its
own, so that a model that fails them never holds the inference thread every model shares. A model that cannot be
loaded is not tried again for `retry_seconds`: its requests get 503 at once meanwhile, with a Retry-After of the
time left.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
import re
import time
from collections.abc import AsyncIterator
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ..manifest import Manifest
from ..runtime.translator import Translator
from .batcher import Batcher
from .metrics import Metrics
from .options import ServeOptions
from .protocol import ApiError, Languages

log = logging.getLogger("onnxmt.serve")

RETRY_AFTER = {"Retry-After": "1"}


@dataclass(eq=False)
class ModelEntry:
    """One model directory of the service; `translator` and `batcher` are set while it is loaded."""

    name: str  # unique in the service: its directory's name, the metrics' `model` label
    directory: Path
    manifest: Manifest
    languages: Languages
    bytes: int  # its files on disk
    translator: Translator | None = None
    batcher: Batcher | None = None
    last_used: float = 0.0
    loads: int = 0
    unloads: int = 0
    active: int = 0  # requests using it now
    evicting: bool = False
    error: str | None = None  # why its last load failed, without the server's paths (shown to clients)
    retry_at: float = 0.0  # time.monotonic() before which a failed load is not tried again
    idle: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    tickets: list[asyncio.Future[None]] = field(default_factory=list, repr=False)  # requests waiting for a load

    def __post_init__(self) -> None:
        self.idle.set()


def model_bytes(directory: Path, manifest: Manifest) -> int:
    """The size of the files a model's sessions read (the manifest's, as they are on disk)."""
    sizes = ((directory / name) for name in manifest.files)
    return sum(path.stat().st_size for path in sizes if path.is_file())


# An absolute path in a message: `/` at a word's start, then folders (the last part, a file's name, is kept).
_FOLDERS = re.compile(r"(?<![\w.~-])/(?:[^\s/'\"]+/)+")


def without_paths(message: str, directory: Path, name: str) -> str:
    """`message` with the model directory shown as `name`, and the folders of any other absolute path left out:
    errors reach clients (503 bodies, `/info`), which are not to learn where the server keeps its files."""
    for shown in sorted({str(directory.resolve()), str(directory.absolute()), str(directory)}, key=len, reverse=True):
        if shown not in ("", "."):
            message = message.replace(shown, name)
    return _FOLDERS.sub("", message)


class Opener(Protocol):
    """What the pool opens models with (serve/loading.py's `Loader`): the service's options, which hold the
    budget; the inference thread; the metrics; and for each model its checks, its load and its batcher."""

    @property
    def options(self) -> ServeOptions: ...

    @property
    def executor(self) -> Executor: ...

    @property
    def metrics(self) -> Metrics: ...

    def check(self, entry: ModelEntry) -> None:
        """On a thread of its own, before `load`."""

    def load(self, entry: ModelEntry) -> Translator:
        """On the inference thread (`executor`)."""

    def make_batcher(self, entry: ModelEntry) -> Batcher:
        """The loaded model's batcher, which the pool starts."""


class ModelPool:
    """Loads models on demand within the budget of `opener.options` (--max-loaded-models, --max-loaded-mb,
    --load-retry-seconds)."""

    def __init__(self, entries: list[ModelEntry], opener: Opener) -> None:
        self.entries = entries
        self._opener = opener
        self.max_models = opener.options.max_loaded_models
        self.max_bytes = int(opener.options.max_loaded_mb * 2**20)
        self.retry_seconds = opener.options.load_retry_seconds
        self._lock = asyncio.Lock()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        for entry in entries:
            opener.metrics.add_model(entry.name)

    @property
    def loaded(self) -> list[ModelEntry]:
        return [e for e in self.entries if e.translator is not None]

    @contextlib.asynccontextmanager
    async def use(self, entry: ModelEntry) -> AsyncIterator[tuple[Translator, Batcher]]:
        """The model loaded, kept loaded while the block runs (it is never unloaded under a request); ApiError 503
        when it cannot be loaded."""
        await self.acquire(entry)
        try:
            assert entry.translator is not None and entry.batcher is not None
            yield entry.translator, entry.batcher
        finally:
            self.release(entry)

    async def acquire(self, entry: ModelEntry) -> None:
        """Returns with `entry` loaded and held (not unloaded until `release`).

        A request that waits for a load gets its hold from the load itself, at the moment it finishes: were it to
        take it when it next runs, another load could unload the model first, and two models under a budget of one
        would take turns unloading each other before any request used them."""
        while True:
            if entry.translator is not None and not entry.evicting:
                self._hold(entry)
                return
            wait = entry.retry_at - time.monotonic()
            if entry.translator is None and entry.error is not None and wait > 0:
                raise ApiError(503, entry.error, {"Retry-After": str(math.ceil(wait))})
            ticket: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            entry.tickets.append(ticket)
            if entry.name not in self._tasks:
                self._tasks[entry.name] = asyncio.create_task(self._bring_in(entry), name=f"onnxmt-load-{entry.name}")
            try:
                await ticket
                return
            except BaseException:
                if ticket.done() and not ticket.cancelled() and ticket.exception() is None:
                    self.release(entry)  # held for this request, which is gone
                elif ticket in entry.tickets:
                    entry.tickets.remove(ticket)
                raise

    def _hold(self, entry: ModelEntry) -> None:
        entry.active += 1
        entry.idle.clear()
        entry.last_used = time.monotonic()

    def release(self, entry: ModelEntry) -> None:
        entry.active -= 1
        entry.last_used = time.monotonic()
        if entry.active == 0:
            entry.idle.set()

    async def _bring_in(self, entry: ModelEntry) -> None:
        try:
            async with self._lock:
                if entry.translator is None:
                    await self._load(entry)
        finally:
            # Both at once (no await between): a request that comes later starts a load of its own.
            self._tasks.pop(entry.name, None)
            self._answer_tickets(entry)

    def _answer_tickets(self, entry: ModelEntry) -> None:
        """Every request waiting for `entry`: held, or the reason it could not be loaded."""
        tickets, entry.tickets = entry.tickets, []
        for ticket in tickets:
            if ticket.done():
                continue
            if entry.translator is not None:
                self._hold(entry)
                ticket.set_result(None)
            else:
                ticket.set_exception(ApiError(503, entry.error or "the service is shutting down", RETRY_AFTER))

    async def _load(self, entry: ModelEntry) -> None:
        await self._make_room(entry)
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        try:
            await asyncio.to_thread(self._opener.check, entry)
            translator = await loop.run_in_executor(self._opener.executor, self._opener.load, entry)
        except Exception as e:  # ModelDirError, ValueError, OSError, onnxruntime's own errors
            log.error("cannot load the model from %s: %s", entry.directory, e)
            entry.error = f"cannot load the model {entry.name}: {without_paths(str(e), entry.directory, entry.name)}"
            entry.retry_at = time.monotonic() + self.retry_seconds
            if self.retry_seconds:
                entry.error += f" (tried again in {self.retry_seconds:g} s at the earliest)"
            return
        self.adopt(entry, translator)
        variant = entry.manifest.provenance.get("variant")  # Optimum/Transformers.js directories
        shown = f" (variant {variant})" if variant else ""
        log.info("model %s%s loaded in %.1f s", entry.name, shown, time.perf_counter() - started)

    def adopt(self, entry: ModelEntry, translator: Translator) -> None:
        """`entry` is loaded now, with `translator`: its batcher starts."""
        entry.error = None
        entry.translator = translator
        entry.batcher = self._opener.make_batcher(entry)
        entry.batcher.start()
        entry.loads += 1
        entry.last_used = time.monotonic()
        self._opener.metrics.model_loads.labels(entry.name).inc()
        self._opener.metrics.model_loaded.labels(entry.name).set(1)

    async def _make_room(self, entry: ModelEntry) -> None:
        """Unload the least recently used models until `entry` fits the budget (all others, if it alone is over
        the size budget: it is loaded anyway, with a warning)."""
        others = sorted(self.loaded, key=lambda e: e.last_used)
        while others and self._over_budget([*others, entry]):
            await self._unload(others.pop(0))
        if self.max_bytes and entry.bytes > self.max_bytes:
            log.warning(
                "model %s (%.0f MB) is larger than --max-loaded-mb (%.0f MB) on its own; loading it anyway",
                entry.name,
                entry.bytes / 2**20,
                self.max_bytes / 2**20,
            )

    def _over_budget(self, entries: list[ModelEntry]) -> bool:
        if self.max_models and len(entries) > self.max_models:
            return True
        return bool(self.max_bytes) and sum(e.bytes for e in entries) > self.max_bytes

    async def _unload(self, entry: ModelEntry) -> None:
        """Wait until the model's requests are answered, then stop its batcher and drop its sessions."""
        entry.evicting = True
        try:
            await entry.idle.wait()
            if entry.batcher is not None:
                await entry.batcher.stop()
            entry.translator = None
            entry.batcher = None
        finally:
            entry.evicting = False
        entry.unloads += 1
        self._opener.metrics.model_unloads.labels(entry.name).inc()
        self._opener.metrics.model_loaded.labels(entry.name).set(0)
        self._opener.metrics.queue_depth.labels(entry.name).set(0)
        gc.collect()  # the sessions' memory goes back now, not at some later collection
        log.info("model %s unloaded (least recently used)", entry.name)

    async def stop(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        for entry in self.entries:  # tickets of a load cancelled before it started
            self._answer_tickets(entry)
        for entry in self.entries:
            if entry.batcher is not None:
                await entry.batcher.stop()
