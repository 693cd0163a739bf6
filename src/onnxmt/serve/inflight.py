"""In-flight batching in the service: the async front end of the scheduler (runtime/scheduler.py) and the running
batches (runtime/running.py).

The event loop only moves requests in and results out: a request's texts become a scheduler `Request`; each round,
`Scheduler.schedule` says which texts join and which give their place back, the inference thread carries that out
and takes steps (the scheduler says which beam width's batch steps next), and the finished texts are counted out
and answered. Texts waiting for a place are encoded meanwhile on an encoder thread of their own (at most
`batch_size` ahead of their admission), so that they join with their caches ready and the encoder's work overlaps
the decoder's. A decoder-only model's prompts are prefilled on the inference thread instead, a chunk at a time
between the steps (`PREFILL_SHARE`), as LLM servers' chunked prefill: a prefill and a step never run at once on the
same cores, and no step waits for a whole prompt. A text's translation is the same as alone (exact in fp32 and
per-row int8), preempted or not.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from functools import partial
from typing import cast

import numpy as np

from ..runtime.cache import Cache
from ..runtime.cancel import CancelToken
from ..runtime.decoder_only import DecoderOnlyGraphs
from ..runtime.options import BatchLimits
from ..runtime.running import RunningBatch, encode_texts, prefixes
from ..runtime.scheduler import Request, Scheduler
from ..runtime.search import Hypothesis
from ..runtime.translator import Translation, Translator
from .batcher import Batcher, _Job

log = logging.getLogger("onnxmt.serve")
Key = tuple[int, int]  # a text in the running batches: its request's id and its place in the scheduler's request


@dataclass
class StepStats:
    """What one round of steps did, for metrics: decoder rows per call, each step's seconds, the requests that had
    rows in it, the tokens of the texts it finished; the requests it admitted for the first time, the texts it
    admitted, how long each of those requests had waited for its first place; texts per encoder call; the texts
    preempted; rows and requests running after it."""

    rows: list[int]
    seconds: list[float]
    requests: int
    generated_tokens: int
    admitted_requests: int = 0
    admitted_texts: int = 0
    join_waits: list[float] = field(default_factory=list)
    encoder_calls: list[int] = field(default_factory=list)
    preempted: int = 0
    running_rows: int = 0
    running_requests: int = 0


@dataclass
class _Round:
    """What the inference thread did between two visits to the event loop."""

    tokens: list[tuple[object, int]] = field(default_factory=list)  # (key, token) greedy rows took
    finished: list[tuple[object, list[Hypothesis]]] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)  # per decoder call
    seconds: list[float] = field(default_factory=list)  # per step
    running_rows: int = 0
    deferred: list[_Join] = field(default_factory=list)  # admitted texts still being encoded: they join later


# Steps the inference thread takes at most before it hands back to the event loop when nothing calls for it sooner
# (a text finished, the scheduler has a change to make, a stream waits for tokens): going back after every step let
# the event loop's other work (HTTP, JSON) delay the next step, 15% of the throughput under 32 clients.
MAX_STEPS_PER_ROUND = 64
# Seconds between looks at the event loop's news while the inference thread, with no rows to step, waits for an
# encoder call.
IDLE_POLL = 0.01
# While prompts wait for their prefill and rows run, the part of the inference thread's time that prefill chunks take
# (the steps have the rest): after each step, chunks run until they have taken that share of the time since. On CPU a
# prompt position costs about what a running row's step does, so that a budget of positions per step as GPU servers
# set it (vLLM's max_num_batched_tokens) would make every step as long as the chunk; a share of the time keeps the
# steps coming whatever the chunk's size, and prompts still progress at half the thread's speed under any load.
PREFILL_SHARE = 0.5
# Texts of requests of more than one text per encoder call: on opus-mt's architecture in int8, 2 threads, a call of
# 8 texts is short enough that a one-text request queued behind it stays within a few steps of its idle latency.
BIG_REQUEST_CALL = 8


@dataclass(eq=False)
class _Entry:
    """A request in flight: `todo`, its texts with something to translate (the scheduler's request holds them in
    this order); their encoder caches while they wait (encoded ahead), and the encoder calls that encode them; the
    translations as they come."""

    job: _Job
    request: Request
    todo: list[int]
    results: list[Translation | None]
    caches: dict[int, Cache] = field(default_factory=dict)
    encoding: dict[int, Future[int]] = field(default_factory=dict)
    started: bool = False  # a text of it was admitted

    @property
    def gone(self) -> bool:
        return self.job.future.done() or self.job.token.cancelled


@dataclass
class _Call:
    """An encoder call waiting for the encoder thread; a decoder-only model's prefill, one chunk at a time on the
    inference thread (`work`: its progress once started; `left`: its prompt positions still to run)."""

    texts: list[tuple[_Entry, int]]
    future: Future[int]
    left: int = 0
    work: Generator[int, None, int] | None = None

    @property
    def arrived(self) -> float:
        return min(e.job.arrived for e, _ in self.texts)

    @property
    def priority(self) -> tuple[int, float]:
        """Encoder calls: the smallest request's size among its texts, then the oldest arrival. Prefill calls: the
        fewest prompt positions left (a short prompt's call runs between a long one's chunks), then the oldest."""
        if self.left:
            return self.left, self.arrived
        return min(len(e.request.costs) for e, _ in self.texts), self.arrived


@dataclass
class _Join:
    """Texts of one request admitted in a round, for the inference thread."""

    entry: _Entry
    texts: list[int]  # places in the scheduler's request
    calls: dict[int, Future[int]]  # text -> the encoder call its cache comes from, if it had not ended when admitted

    def ready(self, text: int) -> bool:
        """Whether `text` can join: its encoder call has ended (if it failed, the text is encoded as it joins)."""
        call = self.calls.get(text)
        return call is None or call.done()

    def split(self) -> tuple[_Join | None, _Join | None]:
        """The texts that can join now and those whose encoder calls run still (None where there are none)."""
        now = [t for t in self.texts if self.ready(t)]
        later = [t for t in self.texts if not self.ready(t)]
        return (
            replace(self, texts=now) if now else None,
            replace(self, texts=later, calls={t: self.calls[t] for t in later}) if later else None,
        )


class InflightBatcher(Batcher):
    """The batcher of a model whose decoder takes one cache length per row (format 4): `translate()` as every
    batcher's; `on_step` is told what each round of steps did."""

    def __init__(
        self,
        translator: Translator,
        executor: Executor,
        *,
        limits: BatchLimits,
        max_queue: int,
        on_queue: Callable[[int], None] = lambda depth: None,
        on_step: Callable[[StepStats], None] = lambda stats: None,
        on_idle: Callable[[], object] | None = None,
    ) -> None:
        super().__init__(
            executor, limits=limits, max_queue=max_queue, on_queue=on_queue, on_idle=partial(self._let_go, on_idle)
        )
        self.translator = translator
        self.scheduler = Scheduler(limits)
        self._on_step = on_step
        self._entries: dict[int, _Entry] = {}  # id(job) -> its entry, while it waits or runs
        self._batches: dict[int, RunningBatch] = {}  # beam width -> its running batch
        self._encoder = ThreadPoolExecutor(1, thread_name_prefix="onnxmt-encoder")
        # A decoder-only model's encoder calls are prefills, run on the inference thread between steps (`_steps`).
        self._prefills = translator.graphs.decoder_only
        self._prefill_credit = 0.0  # seconds the prefills may still take before the next step (`_prefill_beside`)
        # Encoder calls not yet started: the encoder thread takes the one of the smallest request first, so that a
        # short request's call does not wait behind a big request's queued calls.
        self._calls: list[_Call] = []
        self._calls_lock = threading.Lock()
        self._oldest_turn = False  # the last piece went to the oldest prefill call (`_next_call`)
        self._open_calls: set[Future[int]] = set()  # queued or running
        self._encoder_calls: list[int] = []  # texts per encoder call, since the last stats
        self._interrupt = False  # set on the event loop: the scheduler has a change to make, or texts are encoded
        self._deferred: list[_Join] = []  # texts admitted whose encoder call had not ended when the round started
        self._stopping = False

    def _let_go(self, on_idle: Callable[[], object] | None) -> None:
        """On the inference thread, once no request has come for a while: the empty running batches let go of their
        cache buffers (they keep them while requests come: `RunningBatch.release`), then `on_idle`."""
        for batch in self._batches.values():
            batch.release()
        if on_idle is not None:
            on_idle()

    @property
    def depth(self) -> int:
        return sum(1 for entry in self._entries.values() if not entry.started)

    def _enqueue(self, job: _Job) -> None:
        todo = [i for i, p in enumerate(job.texts) if p.ids]
        results: list[Translation | None] = [None] * len(job.texts)
        for i, p in enumerate(job.texts):
            if not p.ids:
                results[i] = Translation(text="", token_ids=[], score=0.0)
        if not todo:
            job.future.set_result(cast(list[Translation], results))
            return
        request = Request([job.texts[i].cost for i in todo], job.arrived, preemptible=job.on_token is None)
        self._entries[id(job)] = _Entry(job, request, todo, results)
        self.scheduler.add(request)
        self._on_queue(self.depth)
        decision = self.scheduler.schedule(job.arrived, commit=False)
        if decision:
            self._interrupt = True  # the inference thread ends its round: the scheduler has a change to make
        fitting = [(self._entries[id(job)], t) for r, t in decision.admit if r is request]
        if fitting and self.scheduler.texts:
            # It joins at the next step: sent to the encoder now, so that its call runs while the running rows step
            # (into an idle batch, the loop admits and encodes at once). While the encoder is busy, a one-text
            # request's text joins a queued call of one-text requests that has not started (`_submit`), which runs
            # before bigger requests' calls: under a flood they are still encoded in batches.
            self._encode(fitting, ahead=False)
        else:
            self._encode([])

    def _forget(self, job: _Job) -> None:
        entry = self._entries.get(id(job))
        if entry is None:
            return
        self.scheduler.drop(entry.request)  # its running texts leave at the next step (its token is cancelled)
        entry.caches.clear()
        if not entry.request.running:
            del self._entries[id(job)]
        self._on_queue(self.depth)

    async def stop(self) -> None:
        for entry in self._entries.values():
            entry.job.token.cancel()
        self._stopping = True
        self._encoder.shutdown(wait=False, cancel_futures=True)
        with self._calls_lock:
            for call in self._calls:
                if call.work is None:
                    call.future.cancel()
                else:  # a prefill between its chunks: no piece of it will run again
                    call.work.close()
                    call.future.set_exception(RuntimeError("the service is shutting down"))
            self._calls.clear()
        for future in list(self._open_calls):  # a call in progress: the model is not let go before it ends
            with contextlib.suppress(BaseException):
                await asyncio.wrap_future(future)
        await super().stop()
        for entry in list(self._entries.values()):
            if not entry.job.future.done():
                entry.job.future.set_exception(RuntimeError("the service is shutting down"))
        self._entries.clear()

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self._entries:
                await self._idle()
            started = loop.time()
            decision = self.scheduler.schedule(started)
            self._interrupt = False
            joins = self._joins(decision.admit)
            first = [j.entry for j in joins if not j.entry.started]
            for entry in first:
                entry.started = True
            self._on_queue(self.depth)
            preempted = [(id(self._entry(r).job), t) for r, t in decision.preempt]
            for request, text in decision.preempt:
                self._entry(request).caches.pop(text, None)  # encoded again when it joins again
            joins = _without(self._deferred, set(preempted)) + joins
            self._deferred = []
            prefilling = self._prefills and bool(self._calls)  # a call of texts gone, or waiting texts' prompts
            if not joins and not preempted and not prefilling and not any(b.rows for b in self._batches.values()):
                self._wakeup.clear()  # nothing to run until something changes
                await self._wakeup.wait()
                continue
            shares = Counter(e.job.settings.num_beams for e in self._entries.values() if e.request.running)
            try:
                done = await loop.run_in_executor(self._executor, self._steps, joins, preempted, shares)
            except Exception as e:  # a failed step fails the requests running; the next ones start afresh
                self._fail_running(e)
                continue
            self._deferred = done.deferred
            self._tokens(done.tokens)
            stats = self._deliver(done)
            stats.admitted_requests = len(first)
            stats.admitted_texts = len(decision.admit)
            stats.join_waits = [started - entry.job.arrived for entry in first]
            stats.encoder_calls, self._encoder_calls = self._encoder_calls, []
            stats.preempted = len(preempted)
            stats.running_rows = done.running_rows
            stats.running_requests = sum(1 for e in self._entries.values() if e.request.running)
            self._on_step(stats)

    def _entry(self, request: Request) -> _Entry:
        return next(e for e in self._entries.values() if e.request is request)

    def _joins(self, admitted: list[tuple[Request, int]]) -> list[_Join]:
        """The admitted texts by request, their encoder calls started (those not encoded nor being encoded, with
        the next waiting texts)."""
        by_request: dict[int, _Join] = {}
        for request, text in admitted:
            entry = self._entry(request)
            by_request.setdefault(id(entry), _Join(entry, [], {})).texts.append(text)
        self._encode([(j.entry, t) for j in by_request.values() for t in j.texts])
        for join in by_request.values():
            join.calls = {t: f for t in join.texts if (f := join.entry.encoding.get(t)) is not None}
        return list(by_request.values())

    def _waiting(self) -> Iterator[tuple[_Entry, int]]:
        """Waiting texts in the order the scheduler will likely admit them: requests with fewer texts running first,
        then the oldest, a request's texts in order."""
        entries = sorted(
            (e for e in self._entries.values() if e.request.waiting and not e.gone),
            key=lambda e: (len(e.request.running), e.job.arrived),
        )
        for entry in entries:
            for text in entry.request.waiting:
                yield entry, text

    def _encode(self, admitted: list[tuple[_Entry, int]], ahead: bool = True) -> None:
        """On the event loop: texts encoded on the encoder thread, while the running batches step. The `admitted`
        texts not encoded yet are sent at once, with the next waiting texts (up to `batch_size` encoded ahead).
        Waiting texts alone are sent when the encoder is idle and they fill the room ahead, if that is at least half
        a call. Not `ahead`: the `admitted` texts alone. Small calls cost
        the encoder, and one call for many requests keeps its batching (one by one, under load, it would run once
        per text); beside the decoder's steps the encoder's work partly fills what the decoder leaves of the
        cores."""
        needed = [(e, t) for e, t in admitted if t not in e.caches and t not in e.encoding]
        busy = bool(self._open_calls)
        if self._stopping or (not needed and busy):
            return
        # Texts encoded ahead, or being: at most a batch of them, and of their cost (tokens x beams) at most the
        # running batch's budget (--max-batch-cost, capped by --max-cache-mb), so that what waits holds at most
        # what runs may (a decoder-only model's prompt caches are its whole attention caches).
        held = [(e, t) for e in self._entries.values() for t in (*e.caches, *e.encoding)]
        room = max(self.limits.batch_size - len(held), 0) if ahead else 0
        budget = self.limits.max_batch_cost
        cost = sum(e.request.costs[t] for e, t in held)
        full = False  # the room ahead is filled by its cost before its number of texts
        upcoming: list[tuple[_Entry, int]] = []
        for entry, text in self._waiting():
            if len(upcoming) >= room:
                break
            if text not in entry.caches and text not in entry.encoding and (entry, text) not in needed:
                if budget is not None and (held or upcoming) and cost + entry.request.costs[text] > budget:
                    full = True
                    break
                cost += entry.request.costs[text]
                upcoming.append((entry, text))
        filled = full or (len(upcoming) >= room and 2 * len(upcoming) >= self.limits.batch_size)
        if not needed and (not upcoming or not filled):
            return  # waiting texts alone are pooled until they fill the room ahead, if that is half a call
        texts = needed + upcoming
        # Texts of one-text requests pooled in calls of up to a batch (the encoder's batching is throughput); those
        # of bigger requests in calls of at most BIG_REQUEST_CALL, so that a short request's call, queued first
        # (`_run_call`), waits at most that long for the call in progress.
        pooled = [(e, t) for e, t in texts if len(e.request.costs) == 1]
        big = [(e, t) for e, t in texts if len(e.request.costs) > 1]
        # A decoder-only model's prompts are prefilled one per call, a chunk at a time: the prompt, not the number
        # of texts, is the work, and each prompt's call is ranked by what it has left (`_Call.priority`).
        prefill = self.translator.graphs.decoder_only
        for group, size in (
            (pooled, 1 if prefill else self.limits.batch_size),
            (big, 1 if prefill else BIG_REQUEST_CALL),
        ):
            for start in range(0, len(group), size):
                self._submit(group[start : start + size])

    def _submit(self, texts: list[tuple[_Entry, int]]) -> None:
        """One encoder call for `texts`, queued for the encoder thread (`_run_call`), or a prefill's for the
        inference thread; texts of one-text requests join a queued encoder call of such texts that has not started,
        if it has room (up to `batch_size`)."""
        loop = asyncio.get_running_loop()
        if not self.translator.graphs.decoder_only and all(len(e.request.costs) == 1 for e, _ in texts):
            with self._calls_lock:  # the encoder thread takes a call out of the queue before it starts it
                pooled = (
                    c
                    for c in self._calls
                    if c.work is None
                    and len(c.texts) + len(texts) <= self.limits.batch_size
                    and all(len(e.request.costs) == 1 for e, _ in c.texts)
                )
                call = next(pooled, None)
                if call is not None:
                    call.texts.extend(texts)  # the list its `encoded` callback reads too
                    for entry, text in texts:
                        entry.encoding[text] = call.future
                    return
        left = sum(len(e.job.texts[e.todo[t]].ids) for e, t in texts) if self.translator.graphs.decoder_only else 0
        call = _Call(texts, Future(), left)
        work = call.future
        for entry, text in texts:
            entry.encoding[text] = work
        self._open_calls.add(work)
        with self._calls_lock:
            self._calls.append(call)
        if not self._prefills:  # prefills are the inference thread's (`_steps`)
            self._encoder.submit(self._run_call)

        def encoded(_: Future[int]) -> None:  # on the encoder thread
            with contextlib.suppress(RuntimeError):  # the loop closed: the service has stopped
                loop.call_soon_threadsafe(self._encoded, work, texts)

        work.add_done_callback(encoded)

    def _run_call(self) -> bool:
        """One piece of the queued call that ranks first (`_Call.priority`): on the encoder thread, one per
        submission; a prefill's on the inference thread, between steps. False if no call is queued. A call with more
        to do (a long prompt's next prefill chunks) is queued again behind its piece, so that a shorter one can run
        first."""
        with self._calls_lock:
            if not self._calls:
                return False
            call = self._next_call()
            self._calls.remove(call)
        if call.work is None:
            if not call.future.set_running_or_notify_cancel():
                return True
            call.work = self._encode_work(call.texts)
        try:
            if all(e.gone for e, _ in call.texts):
                call.work.close()  # nobody waits for it any more: the rest of its prompt is not run
                call.future.set_result(0)
                return True
            call.left -= next(call.work)
        except StopIteration as done:
            call.future.set_result(done.value)
            return True
        except Exception as e:
            call.future.set_exception(e)
            return True
        with self._calls_lock:
            if not self._stopping:  # else `stop` has emptied the queue: this call ends here
                self._calls.append(call)
                return True
        call.work.close()
        call.future.set_exception(RuntimeError("the service is shutting down"))
        return True

    def _next_call(self) -> _Call:
        """The queued call that runs next (the lock held): the first by `_Call.priority`; but while a prefill call
        has waited `max_skip_age` seconds, every other piece goes to the oldest call, so that long prompts keep
        half the prefill however many short ones arrive, and a short one waits at most one piece of them."""
        prefills = [c for c in self._calls if c.left]
        now = time.monotonic() if prefills else 0.0
        aged = [c for c in prefills if now - c.arrived >= self.limits.max_skip_age]
        self._oldest_turn = bool(aged) and not self._oldest_turn
        if self._oldest_turn:
            return min(aged, key=lambda c: c.arrived)
        return min(self._calls, key=lambda c: c.priority)

    def _encoded(self, work: Future[int], texts: list[tuple[_Entry, int]]) -> None:
        """On the event loop, once an encoder call is done: counted, and the next waiting texts sent. A failed call
        is logged; its texts are encoded as they join."""
        self._open_calls.discard(work)
        for entry, text in texts:
            if entry.encoding.get(text) is work:
                del entry.encoding[text]
        if work.cancelled():
            return
        error = work.exception()
        if error is None:
            self._encoder_calls.append(work.result())
        else:
            log.warning("an encoder call failed (%s); its %d texts are encoded as they join", error, len(texts))
        self._encode([])

    def _encode_work(self, texts: list[tuple[_Entry, int]]) -> Generator[int, None, int]:
        """On the encoder thread: the texts encoded in one call (a decoder-only model's prompts prefilled, a chunk
        per piece), each cache kept by its entry until it joins; returns the number of texts."""
        texts = [(e, t) for e, t in texts if not e.gone]
        ids = [e.job.texts[e.todo[t]].ids for e, t in texts]
        graphs = self.translator.graphs
        if graphs.decoder_only:
            caches = yield from cast(DecoderOnlyGraphs, graphs).prefill_steps(prefixes(ids))
        else:
            caches = encode_texts(graphs, self.translator.manifest.tokens["pad"], ids)
        for (entry, text), cache in zip(texts, caches, strict=True):
            # Copies: `encode_texts` gives views into the call's outputs, which would keep the whole call's arrays
            # alive while any of its texts waits, past the bound on texts encoded ahead.
            entry.caches[text] = _copied(cache)
        return len(texts)

    def _steps(self, joins: list[_Join], preempted: list[Key], shares: Counter[int]) -> _Round:
        """On the inference thread: the preempted texts leave, the admitted ones whose encoder calls have ended
        join their running batch (each text as soon as its call ends, at the next step: the running rows never wait
        for the encoder, unless there are none), then the running batches take steps, the width the scheduler picks
        each time, with prompts' prefill chunks between them (`_prefill_beside`), until a text finishes, the
        scheduler has a change to make, or a token is awaited by a stream (at most MAX_STEPS_PER_ROUND). `shares`:
        requests running per beam width."""
        done = _Round()
        if not any(batch.rows for batch in self._batches.values()):
            # Nothing to step meanwhile: prefill, or wait for the encoder, until a text can join, or until a request
            # arrives (its prompt may be prefilled between a long prompt's chunks, and join first).
            while not self._interrupt and not any(j.ready(t) for j in joins for t in j.texts):
                if self._prefills and self._run_call():
                    continue
                if not joins:
                    break
                wait([c for j in joins for c in j.calls.values()], IDLE_POLL, FIRST_COMPLETED)
        if preempted:
            for batch in self._batches.values():
                batch.leave(preempted)
        done.deferred = self._join_ready(joins)  # the running rows do not wait for the encoder: the rest join later
        listening = any(e.job.on_token is not None for e in self._entries.values() if e.request.running)
        while True:
            widths = [beams for beams, batch in self._batches.items() if batch.rows]
            if not widths:
                break
            width = self.scheduler.next_width(widths)
            batch = self._batches[width]
            done.rows.append(batch.rows)
            started = time.perf_counter()
            step = batch.step()
            done.seconds.append(time.perf_counter() - started)
            self.scheduler.stepped(width, done.seconds[-1], shares[width])
            self._prefill_beside(done.seconds[-1])
            done.tokens += step.tokens
            done.finished += step.finished
            if done.finished or (listening and done.tokens) or self._interrupt:
                break
            if done.deferred:
                done.deferred = self._join_ready(done.deferred)  # those encoded meanwhile join at the next step
            if len(done.seconds) >= MAX_STEPS_PER_ROUND:
                break
        done.running_rows = sum(batch.rows for batch in self._batches.values())
        return done

    def _prefill_beside(self, seconds: float) -> None:
        """After a step of `seconds`: prefill chunks, the shortest prompt's first (`_next_call`), until they have
        taken PREFILL_SHARE of the thread's time; a chunk past it is paid back by the next steps. Time not used for
        want of prompts is not saved."""
        if not self._prefills:
            return
        self._prefill_credit += seconds * PREFILL_SHARE / (1 - PREFILL_SHARE)
        while self._prefill_credit > 0:
            started = time.perf_counter()
            if not self._run_call():
                self._prefill_credit = 0.0
                return
            self._prefill_credit -= time.perf_counter() - started

    def _join_ready(self, joins: list[_Join]) -> list[_Join]:
        """The texts of `joins` that are encoded join their running batches; the others are returned."""
        later = []
        for join in joins:
            now, rest = join.split()
            if now is not None:
                self._join(now)
            if rest is not None:
                later.append(rest)
        return later

    def _join(self, join: _Join) -> None:
        """A request's admitted texts into the running batch of its beam width, with their caches if all are
        encoded (else they are encoded as they join)."""
        entry, job = join.entry, join.entry.job
        settings = job.settings
        batch = self._batches.get(settings.num_beams)
        if batch is None:
            batch = RunningBatch(self.translator.graphs, settings.num_beams, self.translator.manifest.tokens["pad"])
            self._batches[settings.num_beams] = batch
        caches = [entry.caches.pop(t, None) for t in join.texts]
        prepared = [job.texts[entry.todo[t]] for t in join.texts]
        batch.admit(
            [p.ids for p in prepared],
            settings,
            [(id(job), t) for t in join.texts],
            [p.prompt.forced_bos for p in prepared],
            cancelled=_polled(job.token, len(join.texts)),
            encoded=None if any(c is None for c in caches) else cast(list[Cache], caches),
        )

    def _tokens(self, tokens: list[tuple[object, int]]) -> None:
        """Each generated token to its request's `on_token`, if it has one."""
        for key, token in tokens:
            job_id, text = cast(Key, key)
            entry = self._entries.get(job_id)
            if entry is None or entry.job.on_token is None:
                continue
            try:
                entry.job.on_token(entry.todo[text], token)
            except Exception:  # a listener's failure is its own: the batch goes on
                log.exception("a token listener failed")

    def _deliver(self, done: _Round) -> StepStats:
        """Each finished text counted out of the scheduler and its translation to its request; a request whose texts
        are all done is answered."""
        requests = sum(1 for e in self._entries.values() if e.request.running)
        tokens = 0
        for key, hypotheses in done.finished:
            job_id, text = cast(Key, key)
            entry = self._entries.get(job_id)
            if entry is None:
                continue
            self.scheduler.finished(entry.request, text)
            translation = self.translator.translation(hypotheses)
            tokens += len(translation.token_ids)
            entry.results[entry.todo[text]] = translation
            if entry.request.left == 0 or (entry.gone and not entry.request.running):
                self._finish(entry)
        return StepStats(done.rows, done.seconds, requests, tokens)

    def _finish(self, entry: _Entry) -> None:
        job = entry.job
        del self._entries[id(job)]
        self.scheduler.drop(entry.request)
        if job.future.done():
            return
        results = [r for r in entry.results if r is not None]
        if job.token.cancelled or len(results) < len(entry.results) or any(r.cancelled for r in results):
            job.future.set_exception(asyncio.TimeoutError())  # never an unfinished translation
        else:
            job.future.set_result(results)

    def _fail_running(self, error: Exception) -> None:
        running = [e for e in self._entries.values() if e.request.running]
        log.warning("a decoder step failed (%s); the %d requests running get the error", error, len(running))
        for entry in running:
            del self._entries[id(entry.job)]
            self.scheduler.drop(entry.request)
            for text in list(entry.request.running):
                self.scheduler.finished(entry.request, text)
            if not entry.job.future.done():
                entry.job.future.set_exception(error)
        self._batches.clear()


def _without(joins: list[_Join], gone: set[Key]) -> list[_Join]:
    """`joins` without the texts `gone` (preempted before they joined)."""
    kept = []
    for join in joins:
        texts = [t for t in join.texts if (id(join.entry.job), t) not in gone]
        if texts:
            kept.append(replace(join, texts=texts))
    return kept


def _copied(cache: Cache) -> Cache:
    return replace(cache, mask=cache.mask.copy(), cross_kv=tuple(a.copy() for a in cache.cross_kv or ()))


def _polled(token: CancelToken, texts: int) -> Callable[[], np.ndarray]:
    """What a request's texts' cohort polls each step: all of them are cancelled once its token is."""
    return lambda: np.full(texts, token.cancelled)
