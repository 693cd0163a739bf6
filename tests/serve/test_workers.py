"""Document workers (serve/workers.py): processes that prepare documents, stopped at a deadline, when the client
leaves or past their memory; a bounded number of jobs wait for them; a stopped worker is replaced."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator

import pytest

from onnxmt.documents.limits import DocumentTooLarge
from onnxmt.serve.workers import ClientLeft, DocumentWorkers, JobError, WorkerBusy, WorkerGone, WorkerTimeout


def pid() -> int:
    return os.getpid()


def sleep_then_pid(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def allocate(megabytes: int) -> int:
    return len(bytearray(megabytes << 20))


def refuse(kind: str) -> None:
    if kind == "too_large":
        raise DocumentTooLarge("too many sentences")
    raise ValueError("not a document") if kind == "value" else KeyError("word/document.xml")


def alive(process_id: int) -> bool:
    try:
        os.kill(process_id, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{process_id}/stat") as stat:  # a zombie is gone too
        return stat.read().split(") ")[1][0] != "Z"


async def never() -> None:
    await asyncio.Event().wait()


async def _workers(n: int = 1, waiting: int = 4, memory_mb: int = 0) -> AsyncIterator[DocumentWorkers]:
    workers = DocumentWorkers(n, waiting, memory_mb)
    workers.start()
    try:
        yield workers
    finally:
        workers.stop()


def run(test: object) -> None:
    asyncio.run(test)  # type: ignore[arg-type]


async def _stopped(
    workers: DocumentWorkers, error: type[Exception], deadline: float, leaves: object, first: int
) -> None:
    """A 60 s job run with `deadline` and `leaves` fails with `error` within 5 s, and its worker `first` is gone."""
    started = time.monotonic()
    with pytest.raises(error):
        await workers.run(sleep_then_pid, (60,), deadline, leaves)
    assert time.monotonic() - started < 5
    await asyncio.sleep(0.2)
    assert not alive(first)


def test_a_job_runs_in_another_process_and_its_errors_come_back_by_kind() -> None:
    async def test() -> None:
        async for workers in _workers():
            worker_pid = await workers.run(pid, (), 30, None)
            assert worker_pid != os.getpid()
            assert await workers.run(pid, (), 30, None) == worker_pid  # the same worker, reused
            for kind, shown in (("too_large", "too_large"), ("value", "value"), ("other", "value")):
                with pytest.raises(JobError) as raised:
                    await workers.run(refuse, (kind,), 30, None)
                assert raised.value.kind == shown
            assert await workers.run(pid, (), 30, None) == worker_pid  # a job's error does not cost its worker

    run(test())


def test_past_the_deadline_the_worker_is_killed_and_replaced() -> None:
    async def test() -> None:
        async for workers in _workers():
            first = await workers.run(pid, (), 30, None)
            await _stopped(workers, WorkerTimeout, 0.5, None, first)
            second = await workers.run(pid, (), 30, None)
            assert second != first

    run(test())


def test_a_client_that_leaves_stops_its_job() -> None:
    async def test() -> None:
        async for workers in _workers():
            first = await workers.run(pid, (), 30, None)

            async def leaves() -> None:
                await asyncio.sleep(0.3)

            await _stopped(workers, ClientLeft, 30, leaves, first)
            assert await workers.run(pid, (), 30, never) != first  # a client that stays: its answer

    run(test())


def test_jobs_waiting_for_a_worker_are_bounded() -> None:
    async def test() -> None:
        async for workers in _workers(1, waiting=2):
            await workers.run(pid, (), 30, None)
            running = [asyncio.create_task(workers.run(sleep_then_pid, (1.0,), 30, None)) for _ in range(2)]
            await asyncio.sleep(0.2)  # the first runs, the second waits: two wait or run, one more may wait
            third = asyncio.create_task(workers.run(sleep_then_pid, (0.0,), 30, None))
            await asyncio.sleep(0.2)
            with pytest.raises(WorkerBusy):
                await workers.run(pid, (), 30, None)
            assert len({*await asyncio.gather(*running, third)}) == 1  # all ran, one after the other, in one worker

    run(test())


def test_a_job_past_the_workers_memory_fails_alone() -> None:
    async def test() -> None:
        async for workers in _workers(memory_mb=1024):
            assert await workers.run(allocate, (64,), 30, None) == 64 << 20
            with pytest.raises(WorkerGone, match="memory"):
                await workers.run(allocate, (4096,), 30, None)
            assert await workers.run(allocate, (64,), 30, None) == 64 << 20

    run(test())


def test_stop_kills_the_workers() -> None:
    async def test() -> None:
        workers = DocumentWorkers(2, 4, 0)
        workers.start()
        pids = set(await asyncio.gather(*(workers.run(sleep_then_pid, (0.3,), 30, None) for _ in range(2))))
        assert len(pids) == 2
        workers.stop()
        await asyncio.sleep(0.2)
        assert not any(alive(p) for p in pids)
        with pytest.raises(WorkerGone):
            await workers.run(pid, (), 30, None)

    run(test())
