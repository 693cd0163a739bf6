"""Micro-batching: requests that arrive together share one decoder batch.

Requests queue in arrival order, their texts prepared (`Translator.prepare`: tokenized, settings resolved). The
batch loop takes the oldest request, waits until it is `window` seconds old or enough texts with the same decoding
settings are queued, and hands those requests' texts to the translator as one call on the single inference
thread; the event loop stays free to accept and reject requests meanwhile. Requests whose settings differ (beams,
max new tokens...) are never mixed: a batch runs one `Settings`, and the others wait for their own batch, in
order. Target languages may mix: each text carries its own forced first token.

Work stops when its request is gone: each request carries a `CancelToken` with its deadline, set as well when the
request ends any other way (its client disconnected, the handler was cancelled). A queued request that is gone
never runs; a running one leaves the decoder batch at the next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from ..runtime.cancel import CancelToken
from ..runtime.options import BatchLimits
from ..runtime.search import Settings
from ..runtime.translator import Prepared, Translation

log = logging.getLogger("onnxmt.serve")

# Seconds without a request after which a batcher runs its `on_idle`: the memory it gives back is faulted in again
# by the next request, so a client that sends one request after another must not pay that on each.
IDLE_SECONDS = 1.0

# The translator call the batcher runs on the inference thread: prepared texts of one setting, one cancel token per
# text and a callback told each decoder batch's size in, translations out.
TranslateFn = Callable[[list[Prepared], list[CancelToken], Callable[[int], None]], list[Translation]]


class QueueFull(Exception):
    """The bounded queue is full: the caller answers 503 with Retry-After."""


class ClientGone(Exception):
    """The client disconnected before its translation was ready; its work was cancelled."""


@dataclass(eq=False)
class _Job:
    texts: list[Prepared]
    settings: Settings
    arrived: float
    future: asyncio.Future[list[Translation]] = field(repr=False)
    token: CancelToken = field(default_factory=CancelToken, repr=False)
    cost: int = 0  # tokens x beams (Prepared.cost, summed)
    # Told (text index, token id) of each token a text generates, where the batcher knows them as they come (in
    # flight, greedy); on the event loop.
    on_token: Callable[[int, int], None] | None = field(default=None, repr=False)


@dataclass
class BatchStats:
    """What one batch did, for metrics."""

    requests: int
    decoder_batches: list[int]  # texts per decoder call
    seconds: float
    generated_tokens: int


class Batcher:
    """What every batcher does for its request handlers: a bounded queue, `translate()` with its timeout, its
    client's disconnection and its cancellation, and `start`/`stop`. Subclasses decide what runs when, within
    `limits`."""

    def __init__(
        self,
        executor: Executor,
        *,
        limits: BatchLimits,
        max_queue: int,
        on_queue: Callable[[int], None],
        on_idle: Callable[[], object] | None = None,
    ) -> None:
        """`on_idle`: run on the executor once the batcher has had no request for IDLE_SECONDS (the service gives
        back the memory its requests let go: runtime.sessions.release_memory)."""
        self._executor = executor
        self.limits = limits
        self.max_queue = max_queue
        self._on_queue = on_queue
        self._on_idle = on_idle
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def depth(self) -> int:
        """Requests waiting for their first place."""
        raise NotImplementedError

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="onnxmt-batcher")

    async def _loop(self) -> None:
        raise NotImplementedError

    async def _idle(self) -> None:
        """With no request to run: wait for one (`_wakeup`); once none has come for IDLE_SECONDS, run `on_idle`
        first, once."""
        self._wakeup.clear()
        if self._on_idle is not None:
            try:
                await asyncio.wait_for(self._wakeup.wait(), IDLE_SECONDS)
                return
            except asyncio.TimeoutError:
                await asyncio.get_running_loop().run_in_executor(self._executor, self._on_idle)
        await self._wakeup.wait()

    def _enqueue(self, job: _Job) -> None:
        """On the event loop: a request joins."""
        raise NotImplementedError

    def _forget(self, job: _Job) -> None:
        """On the event loop: a request is over (answered, timed out, its client gone); what it still waits for
        never runs."""
        raise NotImplementedError

    async def stop(self) -> None:
        """Stop the batch loop. Requests still queued get an error and the work running is cancelled at its next
        step; the server has drained in-flight requests first."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._on_queue(0)

    async def translate(
        self,
        texts: list[Prepared],
        timeout: float | None,
        *,
        disconnected: Callable[[], Awaitable[object]] | None = None,
        on_token: Callable[[int, int], None] | None = None,
    ) -> list[Translation]:
        """Queue `texts` (prepared, of one setting) and wait for their translations; QueueFull at once when the
        queue is full, TimeoutError after `timeout` seconds, ClientGone as soon as `disconnected()` returns. In every
        case but success the request's work is cancelled: dropped from the queue, or stopped at the next decoder
        step. `on_token(text index, token id)`: each token as it is generated, where this batcher can tell (the
        in-flight batcher's greedy rows; a beam's tokens are not final until its text is)."""
        if self.depth >= self.max_queue:
            raise QueueFull(f"the queue is full ({self.max_queue} requests waiting)")
        loop = asyncio.get_running_loop()
        token = CancelToken(None if timeout is None else time.monotonic() + timeout)
        settings = texts[0].settings
        if any(t.settings != settings for t in texts):
            raise ValueError("a request's texts are prepared with one setting")
        job = _Job(texts, settings, loop.time(), loop.create_future(), token, sum(t.cost for t in texts), on_token)
        self._enqueue(job)
        self._wakeup.set()
        gone = asyncio.ensure_future(disconnected()) if disconnected is not None else None
        try:
            waited: list[asyncio.Future[Any]] = [job.future, *([gone] if gone else [])]
            done, _ = await asyncio.wait(waited, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if job.future in done:
                return job.future.result()
            if gone is not None and gone in done:
                raise ClientGone("the client disconnected")
            raise asyncio.TimeoutError()
        finally:
            token.cancel()  # no-op once finished; else the work for this request stops
            if not job.future.done():
                job.future.cancel()  # nobody waits for it: the batch loop will not set it
            if gone is not None:
                gone.cancel()
                with contextlib.suppress(BaseException):
                    await gone
            self._forget(job)


class MicroBatcher(Batcher):
    """Collects concurrent requests into static decoder batches (graphs that take one cache length for all rows)."""

    def __init__(
        self,
        translate: TranslateFn,
        executor: Executor,
        *,
        limits: BatchLimits,
        window: float,
        max_queue: int,
        on_queue: Callable[[int], None] = lambda depth: None,
        on_batch: Callable[[BatchStats], None] = lambda stats: None,
        on_running: Callable[[int, int], None] = lambda rows, requests: None,
        on_idle: Callable[[], object] | None = None,
    ) -> None:
        """`on_running(rows, requests)`: the decoder rows (texts x beams) of each decoder batch as it starts, with
        the requests of the micro-batch it belongs to; (0, 0) once the micro-batch is done. Called on the
        inference thread."""
        super().__init__(executor, limits=limits, max_queue=max_queue, on_queue=on_queue, on_idle=on_idle)
        self._translate = translate
        self.window = window
        self._on_batch = on_batch
        self._on_running = on_running
        self._pending: deque[_Job] = deque()
        self._running: list[_Job] = []

    @property
    def depth(self) -> int:
        return len(self._pending)

    def _enqueue(self, job: _Job) -> None:
        self._pending.append(job)
        self._on_queue(len(self._pending))

    def _forget(self, job: _Job) -> None:
        # A request that timed out or was cancelled while queued gives its place back at once.
        if job in self._pending:
            self._pending.remove(job)
            self._on_queue(len(self._pending))

    async def stop(self) -> None:
        for job in self._running:
            job.token.cancel()
        await super().stop()
        while self._pending:
            job = self._pending.popleft()
            if not job.future.done():
                job.future.set_exception(RuntimeError("the service is shutting down"))

    async def _loop(self) -> None:
        while True:
            while not self._pending:
                await self._idle()
            head = self._pending[0]
            if not await self._collect(head):
                continue  # the oldest request timed out or was cancelled while waiting: start over
            jobs = self._take(head.settings)
            self._on_queue(len(self._pending))
            if jobs:
                await self._run(jobs)

    async def _collect(self, head: _Job) -> bool:
        """Wait until `head` is `window` old or a full batch of its settings is queued; False if `head` left."""
        loop = asyncio.get_running_loop()
        deadline = head.arrived + self.window
        while self._queued_texts(head.settings) < self.limits.batch_size and loop.time() < deadline:
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), deadline - loop.time())
            except asyncio.TimeoutError:
                break
            if not self._pending or self._pending[0] is not head:
                return False
        return True

    def _queued_texts(self, settings: Settings) -> int:
        return sum(len(job.texts) for job in self._pending if job.settings == settings)

    def _take(self, settings: Settings) -> list[_Job]:
        """Remove and return the oldest requests with these settings, up to a full batch in texts and in cost (at
        least one request, however many texts it has: the translator splits it into decoder batches)."""
        taken: list[_Job] = []
        count = cost = 0
        budget = self.limits.max_batch_cost
        for job in list(self._pending):
            if job.future.done() or job.token.cancelled:
                # Its request has left and will remove it after its own clean-up; remove it now, or a batch loop
                # that finds it at the head takes nothing and spins without yielding to that clean-up.
                self._pending.remove(job)
                continue
            if job.settings != settings:
                continue
            if taken and count + len(job.texts) > self.limits.batch_size:
                break
            if taken and budget is not None and cost + job.cost > budget:
                break
            taken.append(job)
            count += len(job.texts)
            cost += job.cost
            self._pending.remove(job)
        return taken

    async def _run(self, jobs: list[_Job]) -> None:
        loop = asyncio.get_running_loop()
        texts = [text for job in jobs for text in job.texts]
        tokens = [job.token for job in jobs for _ in job.texts]
        started = loop.time()
        self._running = jobs
        sizes: list[int] = []  # the decoder batches the translator ran: cut by batch size and by cost
        beams = jobs[0].settings.num_beams

        def on_batch(size: int) -> None:
            sizes.append(size)
            self._on_running(size * beams, len(jobs))

        try:
            results = await loop.run_in_executor(self._executor, self._translate, texts, tokens, on_batch)
        except Exception as e:
            await self._run_alone(jobs, e)
            return
        finally:
            self._running = []
            self._on_running(0, 0)
        self._on_batch(
            BatchStats(
                requests=len(jobs),
                decoder_batches=sizes,
                seconds=loop.time() - started,
                generated_tokens=sum(len(r.token_ids) for r in results),
            )
        )
        for job, part in zip(jobs, _split(results, [len(job.texts) for job in jobs]), strict=True):
            if job.future.done():
                continue
            if job.token.cancelled or any(r.cancelled for r in part):
                job.future.set_exception(asyncio.TimeoutError())  # never an unfinished translation
            else:
                job.future.set_result(part)

    async def _run_alone(self, jobs: list[_Job], error: Exception) -> None:
        """A batch failed: run its requests one by one, so only the request that causes the error gets it."""
        if len(jobs) == 1:
            if not jobs[0].future.done():
                jobs[0].future.set_exception(error)
            return
        log.warning("a batch of %d requests failed (%s); running them one by one", len(jobs), error)
        for job in jobs:
            if not job.future.done():
                await self._run([job])


def _split(results: Sequence[Translation], sizes: list[int]) -> list[list[Translation]]:
    parts, start = [], 0
    for size in sizes:
        parts.append(list(results[start : start + size]))
        start += size
    return parts
