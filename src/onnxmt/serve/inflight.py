"""In-flight batching in the service: requests join the running decoder batch at the next step, and leave it as
their texts finish, so that a short request never waits for someone else's long batch (runtime/running.py).

Requests queue in arrival order, as for `MicroBatcher`, whose waiting, timeouts, cancellation and queue bound this
batcher keeps. Its loop admits the oldest requests that fit (at most `max_batch_size` texts and `max_batch_cost`
tokens x beams running, counting those already running; a request alone always fits), then runs one decoder step
of every running batch on the inference thread, and answers each request once all its texts are done. Waiting
requests are encoded meanwhile on an encoder thread of their own (at most `max_batch_size` texts encoded ahead of
their admission), so that they join with their caches ready and the encoder's work overlaps the decoder's. Each beam
width has its running batch (a decoder call broadcasts a sentence's K/V over its beams, so one call holds one
width); they take turns, a step each. A text's translation is the same as alone (exact in fp32 and per-row int8).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np

from ..runtime.cancel import CancelToken
from ..runtime.graphs import Cache
from ..runtime.running import RunningBatch, encode_texts
from ..runtime.search import Hypothesis
from ..runtime.translator import Translation, Translator
from .batcher import MicroBatcher, _Job

log = logging.getLogger("onnxmt.serve")
Finished = tuple[object, list[Hypothesis]]  # a text's key in the running batch, and its hypotheses


@dataclass
class StepStats:
    """What one round of steps did, for metrics: decoder rows per call, each step's seconds (a step: one call per
    beam width running), the requests that had rows in it, the tokens of the texts it finished; the requests it
    admitted, their texts, and how long each had waited for its place."""

    rows: list[int]
    seconds: list[float]
    requests: int
    generated_tokens: int
    admitted_requests: int = 0
    admitted_texts: int = 0
    join_waits: list[float] = field(default_factory=list)
    encoder_calls: list[int] = field(default_factory=list)  # texts per encoder call (waiting ones with admitted)


@dataclass
class _Round:
    """What the inference thread did between two visits to the event loop."""

    tokens: list[tuple[object, int]] = field(default_factory=list)  # (key, token) greedy rows took
    finished: list[Finished] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)  # per decoder call
    seconds: list[float] = field(default_factory=list)  # per step


# Steps the inference thread takes at most before it hands back to the event loop when nothing calls for it sooner
# (a text finished, a waiting request fits, a stream waits for tokens): going back after every step let the event
# loop's other work (HTTP, JSON) delay the next step, 15% of the throughput under 32 clients.
MAX_STEPS_PER_ROUND = 64


@dataclass(eq=False)
class _Running:
    """A request admitted: its translations as they come, and how many are still running."""

    job: _Job
    results: list[Translation | None]
    left: int


class InflightBatcher(MicroBatcher):
    """The batcher of a model whose decoder takes one cache length per row (format 4): `translate()` as
    `MicroBatcher`'s; `on_step` is told what each round of steps did."""

    def __init__(
        self,
        translator: Translator,
        executor: Executor,
        *,
        on_step: Callable[[StepStats], None] = lambda stats: None,
        **limits: Any,
    ) -> None:
        """`limits`: MicroBatcher's max_batch_size, max_queue, max_batch_cost and on_queue (no window: requests
        join at the next step)."""
        super().__init__(_unused, executor, window=0.0, **limits)
        self.translator = translator
        self._on_step = on_step
        self._batches: dict[int, RunningBatch] = {}
        self._admitted: dict[int, _Running] = {}  # id(job) -> its running state
        self._running_texts = 0
        self._running_cost = 0
        self._encoder = ThreadPoolExecutor(1, thread_name_prefix="onnxmt-encoder")
        self._encoding: Future[int] | None = None  # the encoder thread's work in progress
        self._encoder_calls: list[int] = []  # texts per encoder call on the encoder thread, since the last stats
        self._stopping = False

    async def stop(self) -> None:
        for running in self._admitted.values():
            running.job.token.cancel()
        self._stopping = True
        self._encoder.shutdown(wait=False, cancel_futures=True)
        if self._encoding is not None:  # a call in progress: the model is not let go before it ends
            with contextlib.suppress(BaseException):
                await asyncio.wrap_future(self._encoding)
        await super().stop()

    def _queued(self) -> None:
        self._encode([])

    def _encode(self, admitted: list[_Job]) -> None:
        """On the event loop: requests' texts encoded on the encoder thread, while the running batch steps. The
        `admitted` requests not encoded yet are sent at once, with the oldest waiting requests not encoded yet.
        Waiting requests are also sent on their own, when the encoder thread is idle and either the oldest of them
        fit the running batch now (those are sent, alone: they join at the next step, encoded meanwhile, and their
        join does not hold up the step of every running row) or they fill a call (the room left, if that is at
        least half of `max_batch_size` texts: while the batch is full, waiting requests are pooled, as small calls
        cost the encoder). Up to `max_batch_size` texts of waiting requests are encoded (or being encoded) ahead
        of their admission, which bounds the memory their caches hold; they join later with their caches ready.
        One call for many requests keeps the encoder's batching (one by one, under load, it would run once per
        text), and beside the decoder's steps the encoder's work partly fills what the decoder leaves of the cores:
        on 2 cores, 16 texts decoded (greedy opus-mt int8, 32 tokens) while 16 others were encoded took 406 ms, the
        two one after the other 424 (medians of 11)."""
        for job in admitted:
            if job.encoded is None and not any(p.ids for p in job.texts):
                job.encoded = []  # nothing to encode
        jobs = [job for job in admitted if job.encoded is None and job.encoding is None]
        if self._stopping or (not jobs and self._encoding is not None and not self._encoding.done()):
            return
        admitting = bool(jobs)
        ready, texts, full = 0, sum(len(job.texts) for job in jobs), False
        ahead_texts, ahead_cost = self._running_texts, self._running_cost  # counting the queue's order
        fitting = 0  # the first waiting requests sent that fit the running batch now
        for job in self._pending:
            if job.future.done() or job.token.cancelled:
                job.encoded = None  # gone: its caches are not needed, though it stays queued until it is dropped
                continue
            ahead_texts, ahead_cost = ahead_texts + len(job.texts), ahead_cost + job.cost
            if job.encoded is not None or job.encoding is not None:
                ready += len(job.texts)
                continue
            if ready + texts + len(job.texts) > self.max_batch_size:
                full = True
                break
            # (Into an idle batch, the loop admits and encodes at once.)
            if not admitting and self._running_texts and fitting == len(jobs):
                fitting += self._fits(ahead_texts - len(job.texts), ahead_cost - job.cost, job)
            jobs.append(job)
            texts += len(job.texts)
        filled = (full or ready + texts == self.max_batch_size) and 2 * texts >= self.max_batch_size
        if not jobs or not (admitting or fitting or filled):
            return  # waiting requests alone are pooled until they fill a call: small calls cost the encoder
        if fitting:
            jobs = jobs[:fitting]  # only those that join at the next step: the step waits for their call
        loop = asyncio.get_running_loop()
        work = self._encoder.submit(self._encode_texts, jobs)
        for job in jobs:
            job.encoding = work
        self._encoding = work

        def encoded(_: Future[int]) -> None:  # on the encoder thread
            with contextlib.suppress(RuntimeError):  # the loop closed: the service has stopped
                loop.call_soon_threadsafe(self._encoded, work, jobs)

        work.add_done_callback(encoded)

    def _encoded(self, work: Future[int], jobs: list[_Job]) -> None:
        """On the event loop, once an encoder call is done: counted, and the next waiting requests sent. A failed
        call is logged, and its requests still waiting are encoded again later (those admitted meanwhile are
        encoded as they join: `_steps`)."""
        if work.cancelled():
            return
        error = work.exception()
        if error is None:
            self._encoder_calls.append(work.result())
        else:
            log.warning("an encoder call failed (%s); its %d requests are encoded again as they join", error, len(jobs))
            for job in jobs:
                if job.encoded is None:
                    job.encoding = None
        self._encode([])

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self._pending and not self._admitted:
                self._wakeup.clear()
                await self._wakeup.wait()
            admitted = self._admit(loop.time())
            self._on_queue(len(self._pending))
            self._running = [r.job for r in self._admitted.values()]
            started = loop.time()
            try:
                self._encode([r.job for r in admitted])
                done = await loop.run_in_executor(self._executor, self._steps, admitted)
            except Exception as e:  # a failed step fails the requests running; the next ones start afresh
                self._fail_running(e)
                continue
            self._tokens(done.tokens)
            stats = self._deliver(done)
            stats.admitted_requests = len(admitted)
            stats.admitted_texts = sum(len(r.job.texts) for r in admitted)
            stats.join_waits = [started - r.job.arrived for r in admitted]
            stats.encoder_calls, self._encoder_calls = self._encoder_calls, []
            self._on_step(stats)

    def _admit(self, now: float) -> list[_Running]:
        """The oldest requests that fit the running batch's budgets, in order (a request alone always fits);
        requests already gone are dropped from the queue."""
        admitted: list[_Running] = []
        while self._pending:
            job = self._pending[0]
            if job.future.done() or job.token.cancelled:
                self._pending.popleft()
                continue
            if self._running_texts and not self._fits(self._running_texts, self._running_cost, job):
                break
            self._pending.popleft()
            entry = _Running(job, [None] * len(job.texts), len(job.texts))
            self._admitted[id(job)] = entry
            self._running_texts += len(job.texts)
            self._running_cost += job.cost
            admitted.append(entry)
        return admitted

    def _steps(self, admitted: list[_Running]) -> _Round:
        """On the inference thread: the admitted requests join their running batch once the encoder thread has
        encoded them, then every running batch takes steps, until a text finishes, a waiting request would fit,
        or a token is awaited by a stream (at most MAX_STEPS_PER_ROUND). Texts with nothing to translate are done
        at once."""
        done = _Round()
        works = {id(work): work for work in (r.job.encoding for r in admitted) if work is not None}
        wait(works.values())  # if a call failed, its requests are encoded as they join (`RunningBatch.admit`)
        for entry in admitted:
            job = entry.job
            todo = [i for i, p in enumerate(job.texts) if p.ids]
            done.finished += [((id(job), i), [Hypothesis([], 0.0)]) for i, p in enumerate(job.texts) if not p.ids]
            if not todo:
                continue
            settings = job.settings
            batch = self._batches.get(settings.num_beams)
            if batch is None:
                batch = RunningBatch(self.translator.graphs, settings.num_beams, self.translator.manifest.tokens["pad"])
                self._batches[settings.num_beams] = batch
            batch.admit(
                [job.texts[i].ids for i in todo],
                settings,
                [(id(job), i) for i in todo],
                [job.texts[i].prompt.forced_bos for i in todo],
                cancelled=_polled(job.token, len(todo)),
                encoded=job.encoded,
            )
            job.encoded = None  # the running batch holds them now
        listening = any(r.job.on_token is not None for r in self._admitted.values())
        while self._batches and not done.finished:
            started = time.perf_counter()
            for beams, batch in list(self._batches.items()):
                if batch.rows:
                    done.rows.append(batch.rows)
                    step = batch.step()
                    done.tokens += step.tokens
                    done.finished += step.finished
                if not batch.rows:
                    del self._batches[beams]
            done.seconds.append(time.perf_counter() - started)
            if (listening and done.tokens) or self._fits_waiting() or len(done.seconds) >= MAX_STEPS_PER_ROUND:
                break
        return done

    def _encode_texts(self, jobs: list[_Job]) -> int:
        """On the encoder thread: each job's texts (those with ids) encoded, in one call for all the jobs; how many
        texts."""
        todo = [[p.ids for p in job.texts if p.ids] for job in jobs]
        pad = self.translator.manifest.tokens["pad"]
        caches = iter(encode_texts(self.translator.graphs, pad, [ids for texts in todo for ids in texts]))
        for job, ids in zip(jobs, todo, strict=True):
            # Copies: `encode_texts` gives views into the call's outputs, which would keep the whole call's arrays
            # alive while any of its requests waits, past the bound on texts encoded ahead.
            job.encoded = [_copied(cache) for cache in itertools.islice(caches, len(ids))]
        return sum(len(ids) for ids in todo)

    def _fits(self, texts: int, cost: int, job: _Job) -> bool:
        """Whether `job` would be admitted with `texts` texts and `cost` running (or admitted before it)."""
        if texts + len(job.texts) > self.max_batch_size:
            return False
        budget = self.max_batch_cost
        return budget is None or cost + job.cost <= budget

    def _fits_waiting(self) -> bool:
        """Whether the oldest waiting request would be admitted now (read on the inference thread: the event loop
        changes the queue meanwhile, so a wrong answer only means one round more or less)."""
        try:
            job = self._pending[0]
        except IndexError:
            return False
        if self._running_texts + len(job.texts) > self.max_batch_size:
            return job.future.done() or job.token.cancelled  # gone: the loop drops it, and looks again
        return self._fits(self._running_texts, self._running_cost, job)

    def _tokens(self, tokens: list[tuple[object, int]]) -> None:
        """Each generated token to its request's `on_token`, if it has one."""
        for key, token in tokens:
            job_id, index = cast(tuple[int, int], key)
            entry = self._admitted.get(job_id)
            if entry is None or entry.job.on_token is None:
                continue
            try:
                entry.job.on_token(index, token)
            except Exception:  # a listener's failure is its own: the batch goes on
                log.exception("a token listener failed")

    def _deliver(self, done: _Round) -> StepStats:
        """Each finished text's translation to its request; a request whose texts are all done is answered."""
        requests = len(self._admitted)
        tokens = 0
        for key, hypotheses in done.finished:
            job_id, index = cast(tuple[int, int], key)
            entry = self._admitted.get(job_id)
            if entry is None:
                continue
            translation = self.translator.translation(hypotheses)
            tokens += len(translation.token_ids)
            entry.results[index] = translation
            entry.left -= 1
            if entry.left == 0:
                self._finish(entry)
        return StepStats(done.rows, done.seconds, requests, tokens)

    def _finish(self, entry: _Running) -> None:
        job = entry.job
        del self._admitted[id(job)]
        self._running_texts -= len(job.texts)
        self._running_cost -= job.cost
        if job.future.done():
            return
        results = [r for r in entry.results if r is not None]
        if job.token.cancelled or any(r.cancelled for r in results):
            job.future.set_exception(asyncio.TimeoutError())  # never an unfinished translation
        else:
            job.future.set_result(results)

    def _fail_running(self, error: Exception) -> None:
        log.warning("a decoder step failed (%s); the %d requests running get the error", error, len(self._admitted))
        for entry in list(self._admitted.values()):
            del self._admitted[id(entry.job)]
            if not entry.job.future.done():
                entry.job.future.set_exception(error)
        self._batches.clear()
        self._running_texts = self._running_cost = 0


def _copied(cache: Cache) -> Cache:
    return replace(cache, mask=cache.mask.copy(), cross_kv=tuple(a.copy() for a in cache.cross_kv or ()))


def _polled(token: CancelToken, texts: int) -> Callable[[], np.ndarray]:
    """What a request's texts' cohort polls each step: all of them are cancelled once its token is."""
    return lambda: np.full(texts, token.cancelled)


def _unused(*args: object) -> list[Translation]:
    raise AssertionError("the in-flight batcher runs the running batch, not a translate function")
