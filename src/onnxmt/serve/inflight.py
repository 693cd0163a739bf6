"""In-flight batching in the service: requests join the running decoder batch at the next step, and leave it as
their texts finish, so that a short request never waits for someone else's long batch (runtime/running.py).

Requests queue in arrival order, as for `MicroBatcher`, whose waiting, timeouts, cancellation and queue bound this
batcher keeps. Its loop admits the oldest requests that fit (at most `max_batch_size` texts and `max_batch_cost`
tokens x beams running, counting those already running; a request alone always fits), then runs one decoder step
of every running batch on the inference thread, and answers each request once all its texts are done. Each beam
width has its running batch (a decoder call broadcasts a sentence's K/V over its beams, so one call holds one
width); they take turns, a step each. A text's translation is the same as alone (exact in fp32 and per-row int8).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from ..runtime.cancel import CancelToken
from ..runtime.decoding import Hypothesis
from ..runtime.running import RunningBatch
from ..runtime.translator import Translation, Translator
from .batcher import MicroBatcher, _Job

log = logging.getLogger("onnxmt.serve")


@dataclass
class StepStats:
    """What one round of steps did, for metrics: decoder rows per call, the round's seconds, the requests that had
    rows in it, the tokens of the texts it finished; the requests it admitted, their texts, and how long each had
    waited for its place."""

    rows: list[int]
    seconds: float
    requests: int
    generated_tokens: int
    admitted_requests: int = 0
    admitted_texts: int = 0
    join_waits: list[float] = field(default_factory=list)


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
        self._rows: list[int] = []  # the last round's decoder rows per call

    async def stop(self) -> None:
        for running in self._admitted.values():
            running.job.token.cancel()
        await super().stop()

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
                finished = await loop.run_in_executor(self._executor, self._steps, admitted)
            except Exception as e:  # a failed step fails the requests running; the next ones start afresh
                self._fail_running(e)
                continue
            stats = self._deliver(finished, loop.time() - started)
            stats.admitted_requests = len(admitted)
            stats.admitted_texts = sum(len(r.job.texts) for r in admitted)
            stats.join_waits = [started - r.job.arrived for r in admitted]
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
            running = self._running_texts > 0
            if running and self._running_texts + len(job.texts) > self.max_batch_size:
                break
            budget = self.max_batch_cost
            if running and budget is not None and self._running_cost + job.cost > budget:
                break
            self._pending.popleft()
            entry = _Running(job, [None] * len(job.texts), len(job.texts))
            self._admitted[id(job)] = entry
            self._running_texts += len(job.texts)
            self._running_cost += job.cost
            admitted.append(entry)
        return admitted

    def _steps(self, admitted: list[_Running]) -> list[tuple[object, list[Hypothesis]]]:
        """On the inference thread: the admitted requests join their running batch, then every running batch takes
        one step. Texts with nothing to translate are done at once."""
        finished: list[tuple[object, list[Hypothesis]]] = []
        for entry in admitted:
            job = entry.job
            todo = [i for i, p in enumerate(job.texts) if p.ids]
            finished += [((id(job), i), [Hypothesis([], 0.0)]) for i, p in enumerate(job.texts) if not p.ids]
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
            )
        self._rows = []
        for beams, batch in list(self._batches.items()):
            if batch.rows:
                self._rows.append(batch.rows)
                finished += batch.step().finished
            if not batch.rows:
                del self._batches[beams]
        return finished

    def _deliver(self, finished: list[tuple[object, list[Hypothesis]]], seconds: float) -> StepStats:
        """Each finished text's translation to its request; a request whose texts are all done is answered."""
        requests = len(self._admitted)
        tokens = 0
        for key, hypotheses in finished:
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
        return StepStats(list(self._rows), seconds, requests, tokens)

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


def _polled(token: CancelToken, texts: int) -> Callable[[], np.ndarray]:
    """What a request's texts' cohort polls each step: all of them are cancelled once its token is."""
    return lambda: np.full(texts, token.cancelled)


def _unused(*args: object) -> list[Translation]:
    raise AssertionError("the in-flight batcher runs the running batch, not a translate function")
