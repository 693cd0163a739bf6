"""The scheduler's rules as the service runs them (serve/inflight.py driving runtime/scheduler.py), on the tiny model
with real steps: what every decoder step ran is recorded (the texts of every width's batch, their cost in tokens x
beams), and the rules are checked on that record, not on the scheduler's own counters.

- The budgets: never more texts than --max-batch-size (and its reserve), never more tokens x beams than the batch
  cost (but a text alone), under concurrent requests of several sizes and beam widths; --max-cache-mb's cap too.
- Skip-ahead: a request that does not fit is passed by a later one that does, until it has waited max_skip_age.
- Every beam width's batch progresses while the others run.
- A big request's texts are admitted one by one as places free, and a one-text request sent meanwhile joins before
  the big one's last text.

Every answer is also the library's for its text alone."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from onnxmt import Translator
from onnxmt.runtime.options import BatchLimits
from onnxmt.runtime.running import RunningBatch
from onnxmt.serve import inflight
from onnxmt.serve.inflight import InflightBatcher
from onnxmt.testing import generate_corpus

TEXTS = generate_corpus(23, lines=64)[0]
Key = tuple[int, int]


@dataclass
class Seen:
    """One decoder step: the width that stepped, and every text running in any width's batch before it."""

    width: int
    keys: list[Key]
    costs: list[int]  # each running text's, in tokens x beams
    busy: set[int]  # widths with rows

    @property
    def cost(self) -> int:
        return sum(self.costs)


@dataclass
class Record:
    batcher: Any = None
    steps: list[Seen] = field(default_factory=list)
    admitted: list[tuple[int, int, int]] = field(default_factory=list)  # (request's job id, texts, beams) each

    def cost(self, key: Key) -> int:
        entry = self.batcher._entries[key[0]]
        return int(entry.job.texts[entry.todo[key[1]]].cost)


@pytest.fixture
def record(monkeypatch: pytest.MonkeyPatch) -> Record:
    """Every step of every running batch and every admission into one, as they happen."""
    seen = Record()
    real_step, real_admit = RunningBatch.step, RunningBatch.admit

    def step(batch: RunningBatch) -> Any:
        batches = seen.batcher._batches
        keys = [k for b in batches.values() for c in b.cohorts for k in c.keys]
        keys += [k for b in batches.values() for j in b._joining for k in j.keys]
        busy = {w for w, b in batches.items() if b.rows}
        seen.steps.append(Seen(batch.beams, keys, [seen.cost(k) for k in keys], busy))
        return real_step(batch)

    def admit(batch: RunningBatch, ids: Any, settings: Any, keys: Any, *args: Any, **kwargs: Any) -> Any:
        seen.admitted.append((keys[0][0], len(keys), batch.beams))
        return real_admit(batch, ids, settings, keys, *args, **kwargs)

    monkeypatch.setattr(RunningBatch, "step", step)
    monkeypatch.setattr(RunningBatch, "admit", admit)
    return seen


@pytest.fixture(scope="module")
def translator(tiny_onnx_dir: Path) -> Translator:
    return Translator(tiny_onnx_dir)


@contextlib.asynccontextmanager
async def running(translator: Translator, limits: BatchLimits, record: Record) -> AsyncIterator[InflightBatcher]:
    executor = ThreadPoolExecutor(1, thread_name_prefix="onnxmt-inference")
    batcher = InflightBatcher(translator, executor, limits=limits, max_queue=64)
    record.batcher = batcher
    batcher.start()
    try:
        yield batcher
    finally:
        await batcher.stop()
        executor.shutdown()


def send(batcher: InflightBatcher, translator: Translator, texts: list[str], **options: Any) -> asyncio.Future[Any]:
    return asyncio.ensure_future(batcher.translate(translator.prepare(texts, **options), None))


def alone(translator: Translator, texts: list[str], **options: Any) -> list[str]:
    return [translator.translate([t], **options)[0].text for t in texts]


async def until(condition: Any, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.001)


# (texts, beams, max new tokens) of each request: sizes, widths and lengths mixed.
LOAD = [(3, 1, 30), (1, 2, 20), (5, 1, 40), (2, 2, 30), (1, 1, 10), (4, 2, 20), (1, 1, 40), (6, 1, 20), (1, 2, 40)]


@pytest.mark.parametrize(("max_texts", "max_cost"), [(6, 300), (4, None), (16, 150)])
def test_the_budgets_hold_at_every_step_under_concurrent_load(
    translator: Translator, record: Record, max_texts: int, max_cost: int | None
) -> None:
    limits = BatchLimits(batch_size=max_texts, max_batch_cost=max_cost, reserve=1)
    requests, start = [], 0
    for n, beams, new in LOAD:
        requests.append((TEXTS[start : start + n], {"beams": beams, "max_new_tokens": new}))
        start += n

    async def run() -> list[Any]:
        async with running(translator, limits, record) as batcher:
            futures = [send(batcher, translator, texts, **options) for texts, options in requests]
            return await asyncio.wait_for(asyncio.gather(*futures), 120)

    answers = asyncio.run(run())
    demand = sum(translator.cost(texts, **options) for texts, options in requests)
    assert demand > (max_cost or 0) and sum(len(t) for t, _ in requests) > max_texts + 1  # the premise: too much
    for seen in record.steps:
        assert len(seen.keys) <= max_texts + limits.reserved, seen
        assert max_cost is None or seen.cost <= max_cost or len(seen.keys) == 1, seen
    # The budgets held something back: at some step the batch was full, or its cost within a text of the budget.
    if max_cost is None:
        assert max(len(s.keys) for s in record.steps) >= max_texts
    else:
        largest = max(p.cost for texts, options in requests for p in translator.prepare(texts, **options))
        assert max(s.cost for s in record.steps) > max_cost - largest
    for (texts, options), answer in zip(requests, answers, strict=True):
        assert [t.text for t in answer] == alone(translator, texts, **options)


def test_max_cache_mb_bounds_the_running_batch_of_the_service(tiny_onnx_dir: Path, record: Record) -> None:
    """--max-cache-mb caps the batch cost: the texts running at any step hold at most that many bytes of caches."""
    from fastapi.testclient import TestClient

    from onnxmt.runtime.modeldir import load_manifest
    from onnxmt.serve.app import create_app
    from onnxmt.serve.costs import cache_bytes_per_cost
    from onnxmt.serve.options import ServeOptions

    per_token = cache_bytes_per_cost(load_manifest(tiny_onnx_dir))
    cap = 250  # tokens x beams: two or three of these texts
    options = ServeOptions(max_cache_mb=cap * per_token / 2**20, max_request_cost=0, max_batch_cost=0, cache_size=0)
    bodies = [{"q": text, "beams": 2, "max_new_tokens": 30} for text in TEXTS[:10]]
    with TestClient(create_app(tiny_onnx_dir, options)) as client:
        deadline = time.monotonic() + 60
        while client.get("/ready").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        record.batcher = client.app.state.service.catalog.entries[0].batcher  # type: ignore[attr-defined]
        with ThreadPoolExecutor(len(bodies)) as pool:
            answers = list(pool.map(lambda body: client.post("/translate", json=body), bodies))
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    assert max(len(s.keys) for s in record.steps) >= 2
    assert all(s.cost <= cap or len(s.keys) == 1 for s in record.steps)
    largest = max(c for s in record.steps for c in s.costs)
    assert max(s.cost for s in record.steps) > cap - largest  # the cap was what held the batch back


@pytest.mark.parametrize("max_skip_age", [60.0, 0.0])
def test_a_request_that_does_not_fit_is_passed_until_it_has_waited_max_skip_age(
    translator: Translator, record: Record, max_skip_age: float
) -> None:
    """One text running (60 tokens); a beam-4 request that does not fit beside it, then a short one that does: the
    short one is admitted first while the big one may still be passed, after it once it has waited max_skip_age
    (0: at once)."""
    first = translator.prepare([TEXTS[0]], beams=1, max_new_tokens=60, min_new_tokens=60)
    big = translator.prepare([TEXTS[1]], beams=4, max_new_tokens=40)
    small = translator.prepare([TEXTS[2]], beams=1, max_new_tokens=4)
    budget = first[0].cost + small[0].cost
    assert first[0].cost + big[0].cost > budget  # the big one does not fit beside the first; the small one does
    limits = BatchLimits(batch_size=8, max_batch_cost=budget, max_skip_age=max_skip_age, reserve=0)

    async def run() -> list[Any]:
        async with running(translator, limits, record) as batcher:
            one = asyncio.ensure_future(batcher.translate(first, None))
            await until(lambda: batcher.scheduler.texts == 1)
            two = asyncio.ensure_future(batcher.translate(big, None))
            await until(lambda: len(batcher.scheduler.requests) == 2)
            three = asyncio.ensure_future(batcher.translate(small, None))
            return await asyncio.wait_for(asyncio.gather(one, two, three), 120)

    answers = asyncio.run(run())
    # Admissions by width: the first (1), then the short one (1) passing the big one (4), or the big one first.
    assert [beams for _, _, beams in record.admitted] == ([1, 1, 4] if max_skip_age else [1, 4, 1])
    assert [a[0].text for a in answers] == [
        alone(translator, [TEXTS[0]], beams=1, max_new_tokens=60, min_new_tokens=60)[0],
        alone(translator, [TEXTS[1]], beams=4, max_new_tokens=40)[0],
        alone(translator, [TEXTS[2]], beams=1, max_new_tokens=4)[0],
    ]


def test_every_beam_widths_batch_progresses_while_the_others_run(
    translator: Translator, record: Record, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three widths running at once, two texts each, forced to 50 tokens. A step's time is made its rows' (1 ms
    a row, on a clock of the test's): the widths share the time by request, a third each, so the one-beam batch
    steps four times as often as the four-beam one, and every width steps again within a few steps of its last
    for as long as it has rows; none waits for another to finish."""
    clock = [0.0]
    real_step = RunningBatch.step

    def step(batch: RunningBatch) -> Any:
        clock[0] += 0.001 * batch.rows
        return real_step(batch)

    monkeypatch.setattr(RunningBatch, "step", step)  # inside the recording
    monkeypatch.setattr(inflight, "time", SimpleNamespace(perf_counter=lambda: clock[0], monotonic=time.monotonic))
    forced = {"max_new_tokens": 50, "min_new_tokens": 50}
    requests = [(TEXTS[10 + 2 * i : 12 + 2 * i], {"beams": beams, **forced}) for i, beams in enumerate((1, 2, 4))]

    async def run() -> list[Any]:
        async with running(translator, BatchLimits(batch_size=16), record) as batcher:
            futures = [send(batcher, translator, texts, **options) for texts, options in requests]
            return await asyncio.wait_for(asyncio.gather(*futures), 120)

    answers = asyncio.run(run())
    together = [s for s in record.steps if s.busy == {1, 2, 4}]
    assert len(together) >= 50  # the premise: they ran side by side
    seconds = {w: sum(2 * w for s in together if s.width == w) for w in (1, 2, 4)}  # ms: two texts of w rows
    for width in (1, 2, 4):
        assert seconds[width] / sum(seconds.values()) == pytest.approx(1 / 3, abs=0.05), seconds
        gap = longest = 0
        for seen in together:
            gap = 0 if seen.width == width else gap + 1
            longest = max(longest, gap)
        assert longest <= 8, (width, [s.width for s in together])
    for (texts, options), answer in zip(requests, answers, strict=True):
        assert [t.text for t in answer] == alone(translator, texts, **options)


def test_a_big_requests_texts_are_admitted_one_by_one_and_a_short_request_joins_among_them(
    translator: Translator, record: Record
) -> None:
    """Four places, a request of 12 texts of several lengths: its texts join as places free (never more than four
    running), and a one-text request sent once it runs is admitted before the big one's last text."""
    big_texts, short_text = TEXTS[30:42], TEXTS[50]
    options = {"beams": 1, "max_new_tokens": 30}

    async def run() -> tuple[list[Any], list[Any]]:
        async with running(translator, BatchLimits(batch_size=4, reserve=0), record) as batcher:
            big = send(batcher, translator, big_texts, **options)
            await until(lambda: batcher.scheduler.texts == 4)
            short = await send(batcher, translator, [short_text], beams=1, max_new_tokens=4)
            return await asyncio.wait_for(big, 120), short

    big, short = asyncio.run(run())
    assert max(len(s.keys) for s in record.steps) <= 4
    jobs = list(dict.fromkeys(job for job, _, _ in record.admitted))
    big_job, short_job = jobs[0], jobs[1]
    big_admissions = [(i, n) for i, (job, n, _) in enumerate(record.admitted) if job == big_job]
    assert sum(n for _, n in big_admissions) >= 12 and len(big_admissions) >= 3  # in several admissions
    assert big_admissions[0][1] <= 4
    short_at = next(i for i, (job, _, _) in enumerate(record.admitted) if job == short_job)
    assert short_at < big_admissions[-1][0]
    assert [t.text for t in big] == alone(translator, big_texts, **options)
    assert [t.text for t in short] == alone(translator, [short_text], beams=1, max_new_tokens=4)
