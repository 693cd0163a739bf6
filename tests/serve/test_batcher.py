"""Micro-batching (serve/batcher.py), in process: requests that arrive together share one decoder batch, never one
of other settings; the queue's bound and timeout; the work of requests that are gone is cancelled."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest

from onnxmt.architectures import Prompt
from onnxmt.runtime.cancel import CancelToken
from onnxmt.runtime.options import BatchLimits
from onnxmt.runtime.search import Settings
from onnxmt.runtime.translator import Prepared, Translation
from onnxmt.serve import batcher as batcher_module
from onnxmt.serve.batcher import BatchStats, ClientGone, MicroBatcher, QueueFull

SETTINGS = Settings(
    num_beams=1, max_length=8, min_length=0, length_penalty=1.0, early_stopping=False, num_return_sequences=1,
    decoder_start=9, eos_ids=(0,), pad=9,
)  # fmt: skip


def _prepared(texts: list[str], beams: int = 1) -> list[Prepared]:
    """Texts as `Translator.prepare` gives them, for a fake translate function."""
    return [Prepared(text, (1, 0), Prompt(), replace(SETTINGS, num_beams=beams)) for text in texts]


def _echo(prepared: list[Prepared]) -> list[Translation]:
    return [Translation(f"{p.settings.num_beams}:{p.text}", [1], 0.0) for p in prepared]


def test_batcher_reports_the_decoder_batches_the_translator_ran() -> None:
    # The translator cuts a batch by size and by cost: the metrics count its decoder batches, not a guess.
    seen: list[BatchStats] = []

    def translate(
        prepared: list[Prepared], tokens: list[CancelToken], on_batch: Callable[[int], None]
    ) -> list[Translation]:
        for size in (3, 1, 2):
            on_batch(size)
        return _echo(prepared)

    async def main() -> None:
        with ThreadPoolExecutor(1) as executor:
            batcher = MicroBatcher(
                translate, executor, limits=BatchLimits(8), window=0, max_queue=10, on_batch=seen.append
            )
            batcher.start()
            await batcher.translate(_prepared(list("abcdef")), timeout=10)
            await batcher.stop()

    asyncio.run(main())
    assert [s.decoder_batches for s in seen] == [[3, 1, 2]]


def test_batcher_batches_but_never_mixes_settings() -> None:
    calls: list[tuple[list[str], int]] = []

    def translate(prepared: list[Prepared], tokens: list[CancelToken], on_batch: object) -> list[Translation]:
        texts = [p.text for p in prepared]
        calls.append((texts, prepared[0].settings.num_beams))
        time.sleep(0.01)
        return _echo(prepared)

    async def main() -> list[list[Translation]]:
        with ThreadPoolExecutor(1) as executor:
            batcher = MicroBatcher(translate, executor, limits=BatchLimits(4), window=0.02, max_queue=100)
            batcher.start()
            results = await asyncio.gather(
                *(batcher.translate(_prepared([f"{i}"], beams=1 + i % 2), timeout=10) for i in range(20))
            )
            await batcher.stop()
            return results

    results = asyncio.run(main())
    assert results == [_echo(_prepared([f"{i}"], beams=1 + i % 2)) for i in range(20)]
    for texts, beams in calls:
        assert len(texts) <= 4
        assert all(1 + int(text) % 2 == beams for text in texts)
    assert max(len(texts) for texts, _ in calls) > 1


def _gated(gate: threading.Event) -> Callable[..., list[Translation]]:
    """A translate function for MicroBatcher that holds the inference thread until `gate` is set."""

    def blocked(prepared: list[Prepared], tokens: list[CancelToken], on_batch: object) -> list[Translation]:
        gate.wait(30)
        return _echo(prepared)

    return blocked


def test_batcher_queue_full_and_timeout() -> None:
    gate = threading.Event()
    blocked = _gated(gate)

    async def main() -> None:
        with ThreadPoolExecutor(1) as executor:
            batcher = MicroBatcher(blocked, executor, limits=BatchLimits(1), window=0, max_queue=1)
            batcher.start()
            running = asyncio.create_task(batcher.translate(_prepared(["a"]), None))
            await asyncio.sleep(0.1)
            waiting = asyncio.create_task(batcher.translate(_prepared(["b"]), 0.2))
            await asyncio.sleep(0.01)
            with pytest.raises(QueueFull):
                await batcher.translate(_prepared(["c"]), None)
            with pytest.raises(asyncio.TimeoutError):
                await waiting
            assert batcher.depth == 0  # the request that timed out gave its place back
            queued = asyncio.create_task(batcher.translate(_prepared(["d"]), None))
            gate.set()
            assert await running == _echo(_prepared(["a"]))
            assert await queued == _echo(_prepared(["d"]))
            await batcher.stop()

    asyncio.run(main())


def test_batcher_cancels_the_work_of_requests_that_are_gone() -> None:
    # A fake decoder that works in 10 ms steps until its texts' tokens are all set, as the decoding loop does.
    ran: list[list[str]] = []

    def stepping(prepared: list[Prepared], tokens: list[CancelToken], on_batch: object) -> list[Translation]:
        texts = [p.text for p in prepared]
        ran.append(texts)
        for _ in range(1 if texts == ["small"] else 500):
            if all(t.cancelled for t in tokens):
                return [Translation("", [], 0.0, cancelled=True) for _ in texts]
            time.sleep(0.01)
        return _echo(prepared)

    async def main() -> None:
        with ThreadPoolExecutor(1) as executor:
            batcher = MicroBatcher(stepping, executor, limits=BatchLimits(1), window=0, max_queue=10)
            batcher.start()
            loop = asyncio.get_running_loop()
            # Timed out while running: the work stops, and the next request runs at once.
            heavy = asyncio.create_task(batcher.translate(_prepared(["heavy"]), 0.3))
            await asyncio.sleep(0.05)
            queued = asyncio.create_task(batcher.translate(_prepared(["queued"]), 0.1))
            with pytest.raises(asyncio.TimeoutError):
                await heavy
            with pytest.raises(asyncio.TimeoutError):
                await queued
            start = loop.time()
            gate = asyncio.Event()

            async def disconnected() -> None:
                await gate.wait()

            # The client disconnects: ClientGone, and the work stops too.
            left = asyncio.create_task(batcher.translate(_prepared(["left"]), 60, disconnected=disconnected))
            await asyncio.sleep(0.1)
            gate.set()
            with pytest.raises(ClientGone):
                await left
            assert await batcher.translate(_prepared(["small"]), 1) == _echo(_prepared(["small"]))
            assert loop.time() - start < 6  # each cancelled request would have held the thread 5 s
            await batcher.stop()

    asyncio.run(main())
    assert ran[0] == ["heavy"] and ["queued"] not in ran  # the queued request's deadline passed: it never ran


def test_batcher_does_not_spin_on_a_request_that_left_but_is_still_queued() -> None:
    # A queued request that timed out is dropped from the queue only after its own clean-up, which awaits its
    # disconnect watcher. A batch finishing in that window found the dead request at the head of the queue, took
    # nothing and looped without ever yielding: the event loop spun at 100% CPU and SIGTERM was never handled.
    release = threading.Event()
    blocked = _gated(release)

    async def slow_to_stop() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            await asyncio.sleep(0.5)  # its clean-up takes a while: the window in which the batch ends
            raise

    async def main() -> tuple[list[Translation], list[Translation]]:
        with ThreadPoolExecutor(1) as executor:
            batcher = MicroBatcher(blocked, executor, limits=BatchLimits(1), window=0, max_queue=10)
            batcher.start()
            loop = asyncio.get_running_loop()
            running = asyncio.create_task(batcher.translate(_prepared(["a"]), None))
            await asyncio.sleep(0.05)
            queued = asyncio.create_task(batcher.translate(_prepared(["b"], beams=2), 0.2, disconnected=slow_to_stop))
            loop.call_later(0.4, release.set)  # the running batch ends while "b" is still cleaning up
            first = await running
            with pytest.raises(asyncio.TimeoutError):
                await queued
            after = await batcher.translate(_prepared(["c"]), 5)
            await batcher.stop()
            return first, after

    outcome: list[tuple[list[Translation], list[Translation]]] = []
    # On its own thread, so a spinning event loop fails the test instead of hanging it.
    thread = threading.Thread(target=lambda: outcome.append(asyncio.run(main())), daemon=True)
    thread.start()
    thread.join(20)
    assert not thread.is_alive(), "the batch loop spun on the request that had left"
    assert outcome == [(_echo(_prepared(["a"])), _echo(_prepared(["c"])))]


def test_batcher_runs_on_idle_once_each_time_it_has_been_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    # The service gives back memory when idle (`on_idle`), on the inference thread: not between requests that follow
    # each other (the next one would fault that memory in again), once per idle spell however long it lasts.
    monkeypatch.setattr(batcher_module, "IDLE_SECONDS", 0.3)
    idle: list[str] = []
    counts: list[int] = []

    async def main() -> None:
        with ThreadPoolExecutor(1, thread_name_prefix="inference") as executor:
            batcher = MicroBatcher(
                lambda prepared, tokens, on_batch: _echo(prepared),
                executor,
                limits=BatchLimits(4),
                window=0,
                max_queue=10,
                on_idle=lambda: idle.append(threading.current_thread().name),
            )
            batcher.start()
            for text in "abcde":
                await batcher.translate(_prepared([text]), timeout=10)
                await asyncio.sleep(0.02)
            counts.append(len(idle))
            await asyncio.sleep(1.0)
            counts.append(len(idle))
            await batcher.translate(_prepared(["f"]), timeout=10)
            await asyncio.sleep(0.6)
            counts.append(len(idle))
            await batcher.stop()

    asyncio.run(main())
    assert counts == [0, 1, 2]
    assert all(name.startswith("inference") for name in idle)
