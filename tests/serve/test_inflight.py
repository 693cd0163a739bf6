"""In-flight batching in the service (serve/inflight.py): a short request joins the running decoder batch and is
answered while long ones run, every answer is the library's, and old decoders keep static batches."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from onnxmt import Translator
from onnxmt.runtime.options import BatchLimits, RuntimeOptions
from onnxmt.runtime.running import RunningBatch
from onnxmt.serve import inflight
from onnxmt.serve.app import create_app
from onnxmt.serve.inflight import InflightBatcher
from onnxmt.serve.options import ServeOptions
from onnxmt.testing import generate_corpus
from tests.helpers.server import metric_sample, start_server

TEXTS = generate_corpus(41, lines=64)[0]


def test_a_short_request_is_answered_while_long_ones_run(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    server = start_server(tiny_onnx_dir, tmp_path, max_batch_size=32, max_request_cost=0, max_batch_cost=0)
    long_body = {"q": TEXTS[:8], "beams": 1, "max_new_tokens": 60}
    short_body = {"q": "Hello world.", "beams": 1, "max_new_tokens": 3}

    async def run() -> tuple[list[httpx.Response], httpx.Response, float, list[float]]:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            done_at: list[float] = []

            async def long() -> httpx.Response:
                response = await client.post("/translate", json=long_body)
                done_at.append(time.monotonic())
                return response

            longs = [asyncio.create_task(long()) for _ in range(3)]
            # The long requests are in the server (being decoded, or queued behind a static batch).
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                metrics = (await client.get("/metrics")).text
                if metric_sample(metrics, "onnxmt_batch_requests_sum", model="model") >= 3:
                    break
                await asyncio.sleep(0.005)
            assert not done_at, "the long requests finished before the short one was sent: nothing was tested"
            # What runs is visible, not only what waits.
            assert metric_sample(metrics, "onnxmt_running_requests", model="model") >= 1
            assert metric_sample(metrics, "onnxmt_running_rows", model="model") >= 8
            short = await client.post("/translate", json=short_body)
            short_done = time.monotonic()
            return await asyncio.gather(*longs), short, short_done, done_at

    try:
        longs, short, short_done, long_done = asyncio.run(run())
        metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    finally:
        assert server.stop() == 0, server.logs()
    assert short.status_code == 200 and all(r.status_code == 200 for r in longs)
    assert short_done < min(long_done), "the short request waited for the long ones"
    translator = Translator(tiny_onnx_dir)
    assert short.json()["translatedText"] == translator.translate(["Hello world."], beams=1, max_new_tokens=3)[0].text
    expected = [t.text for t in translator.translate(TEXTS[:8], beams=1, max_new_tokens=60)]
    assert all(r.json()["translatedText"] == expected for r in longs)
    assert metric_sample(metrics, "onnxmt_running_rows", model="model") == 0  # all done
    assert metric_sample(metrics, "onnxmt_running_requests", model="model") == 0
    # The requests shared decoder calls: some steps carried more than one request's rows.
    assert metric_sample(metrics, "onnxmt_step_requests_bucket", le="1.0", model="model") < metric_sample(
        metrics, "onnxmt_step_requests_count", model="model"
    )


@pytest.mark.parametrize("form", ["rows", "concat"])
def test_info_says_whether_a_model_runs_in_flight(form: str, tiny_onnx_dir: Path, tiny_concat_onnx_dir: Path) -> None:
    directory = tiny_onnx_dir if form == "rows" else tiny_concat_onnx_dir
    with TestClient(create_app(directory, ServeOptions())) as client:
        deadline = time.monotonic() + 60
        while client.get("/ready").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        info = client.get("/info").json()
        answer = client.post("/translate", json={"q": TEXTS[:4], "beams": 2, "max_new_tokens": 12})
    assert info["batching"]["in_flight"] is (form == "rows")
    expected = Translator(directory).translate(TEXTS[:4], beams=2, max_new_tokens=12)
    assert answer.json()["translatedText"] == [t.text for t in expected]


@pytest.mark.parametrize(
    ("form", "encoder_threads", "expected"), [("rows", None, 2), ("concat", None, 4), ("rows", 3, 3)]
)
def test_a_model_batched_in_flight_encodes_on_half_the_threads(
    form: str, encoder_threads: int | None, expected: int, tiny_onnx_dir: Path, tiny_concat_onnx_dir: Path
) -> None:
    """The encoder of a model batched in flight runs beside the decoder: by default on half of `--threads`; a model
    with static batches encodes on all of them; `--encoder-threads` wins. The sessions are opened so (/info reads
    them back) and the answers stay the library's."""
    directory = tiny_onnx_dir if form == "rows" else tiny_concat_onnx_dir
    runtime = RuntimeOptions(threads=4, encoder_threads=encoder_threads)
    with TestClient(create_app(directory, ServeOptions(), runtime)) as client:
        deadline = time.monotonic() + 60
        while client.get("/ready").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        info = client.get("/info").json()
        answer = client.post("/translate", json={"q": TEXTS[:4], "beams": 2, "max_new_tokens": 12})
        service = client.app.state.service  # type: ignore[attr-defined]
        entry = service.catalog.entries[0]
        # A model of a directory of models is opened by its manifest, read before it is loaded: the same choice.
        chosen = service.loader.runtime_for(entry.directory, entry.manifest)
        assert (chosen.encoder_threads or chosen.threads) == expected
    [model] = info["models"]
    assert model["encoder_threads"] == expected
    assert model["in_flight"] is (form == "rows")
    expected_texts = Translator(directory).translate(TEXTS[:4], beams=2, max_new_tokens=12)
    assert answer.json()["translatedText"] == [t.text for t in expected_texts]


def test_a_model_of_a_directory_of_models_is_loaded_with_the_same_encoder_threads(
    tiny_onnx_dir: Path, tmp_path: Path
) -> None:
    """A directory of model directories: its models are loaded on first use (and again after an unload) by the
    model pool, which opens them with the same choice of encoder threads as a single model."""
    models = tmp_path / "models"
    models.mkdir()
    (models / "opus").symlink_to(tiny_onnx_dir, target_is_directory=True)
    with TestClient(create_app(models, ServeOptions(), RuntimeOptions(threads=4))) as client:
        deadline = time.monotonic() + 60
        while client.get("/ready").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        before = client.get("/info").json()["models"]
        answer = client.post("/translate", json={"q": TEXTS[:2], "beams": 1, "max_new_tokens": 8})
        after = client.get("/info").json()["models"]
    assert [m["loaded"] for m in before] == [False] and [m["encoder_threads"] for m in before] == [None]
    assert answer.status_code == 200, answer.text
    assert [(m["loaded"], m["in_flight"], m["encoder_threads"]) for m in after] == [(True, True, 2)]


def test_requests_waiting_for_a_place_are_encoded_together(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    """16 one-text requests at once into 4 places: those waiting are encoded in the call of the first that joins
    (fewer encoder calls than texts, every text encoded once), and each answer is the library's for its text."""
    server = start_server(tiny_onnx_dir, tmp_path, max_batch_size=4, max_request_cost=0, max_batch_cost=0)
    texts = TEXTS[10:26]

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            body = {"beams": 1, "max_new_tokens": 40}
            return await asyncio.gather(*(client.post("/translate", json={"q": t, **body}) for t in texts))

    try:
        answers = asyncio.run(run())
        metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    finally:
        assert server.stop() == 0, server.logs()
    assert all(r.status_code == 200 for r in answers)
    translator = Translator(tiny_onnx_dir)
    expected = [translator.translate([t], beams=1, max_new_tokens=40)[0].text for t in texts]
    assert [r.json()["translatedText"] for r in answers] == expected
    assert metric_sample(metrics, "onnxmt_encoder_texts_sum", model="model") == len(texts)
    assert metric_sample(metrics, "onnxmt_encoder_texts_count", model="model") <= len(texts) / 2  # 2+ texts a call


@contextlib.asynccontextmanager
async def _two_places(translator: Translator) -> AsyncIterator[InflightBatcher]:
    """An in-flight batcher of `translator` with room for two texts (none reserved), on an inference thread."""
    executor = ThreadPoolExecutor(1, thread_name_prefix="onnxmt-inference")
    batcher = InflightBatcher(translator, executor, limits=BatchLimits(batch_size=2, reserve=0), max_queue=16)
    batcher.start()
    try:
        yield batcher
    finally:
        await batcher.stop()
        executor.shutdown()


# The first requests of a test run while the others arrive: a fixed length, long enough for a slow machine.
LONG = {"max_new_tokens": 60, "min_new_tokens": 60}


def _waiting(batcher: InflightBatcher) -> list[Any]:
    """The requests waiting for their first place."""
    return [e for e in batcher._entries.values() if not e.started]


def _send(
    batcher: InflightBatcher, translator: Translator, texts: list[str], **options: int
) -> list[asyncio.Future[Any]]:
    """One request per text (40 new tokens each, or `options`), queued in order."""
    options = options or {"max_new_tokens": 40}
    return [asyncio.ensure_future(batcher.translate(translator.prepare([t], **options), None)) for t in texts]


def _alone(translator: Translator, texts: list[str], **options: int) -> list[str]:
    """What the library gives for each text alone (40 new tokens, or `options`)."""
    options = options or {"max_new_tokens": 40}
    return [translator.translate([t], **options)[0].text for t in texts]


def test_an_idle_batcher_lets_go_of_its_batches_cache_buffers(
    tiny_onnx_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A running batch keeps its cache buffers between requests (the next ones join into them); once no request
    has come for IDLE_SECONDS the batcher lets them go, and a request after that is answered as alone."""
    from onnxmt.serve import batcher as batcher_module

    monkeypatch.setattr(batcher_module, "IDLE_SECONDS", 0.2)
    translator = Translator(tiny_onnx_dir)

    async def run() -> tuple[list[str], list[bool]]:
        async with _two_places(translator) as batcher:
            held = []
            first = await asyncio.gather(*_send(batcher, translator, TEXTS[:2]))
            (batch,) = batcher._batches.values()  # the model's default beam width
            held.append(batch.slots is not None)  # answered: the buffers are kept
            deadline = time.monotonic() + 30
            while batch.slots is not None and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            held.append(batch.slots is not None)
            second = await asyncio.gather(*_send(batcher, translator, TEXTS[2:4]))
            return [d[0].text for d in first + second], held

    answers, held = asyncio.run(run())
    assert held == [True, False]
    assert answers == _alone(translator, TEXTS[:4])


def test_waiting_requests_are_encoded_on_the_encoder_thread_while_the_batch_steps(
    tiny_onnx_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two places, four one-text requests: the two waiting are encoded in one call on the encoder thread while the
    first two are decoded (they wait encoded, and join with their caches ready); every text is encoded once, and
    every answer is the library's for its text alone."""
    translator = Translator(tiny_onnx_dir)
    texts = TEXTS[30:34]
    calls: list[tuple[str, int, int]] = []  # (thread, texts encoded, texts running meanwhile)
    real = inflight.encode_texts
    # The first two texts' steps wait (once both run) until the other two have been seen waiting, encoded: on a tiny
    # model their 60 steps would otherwise end before the test looks.
    looked = threading.Event()
    step = RunningBatch.step

    def held(self: RunningBatch) -> Any:
        if self.texts >= 2:
            looked.wait(30)
        return step(self)

    monkeypatch.setattr(RunningBatch, "step", held)

    async def run() -> tuple[list[str], list[bool]]:
        async with _two_places(translator) as batcher:

            def encode(graphs: Any, pad: int, ids: list[list[int]]) -> Any:
                calls.append((threading.current_thread().name, len(ids), batcher.scheduler.texts))
                return real(graphs, pad, ids)

            monkeypatch.setattr(inflight, "encode_texts", encode)
            first = _send(batcher, translator, texts[:2], **LONG)
            deadline = time.monotonic() + 30
            while batcher.scheduler.texts < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.001)
            later = _send(batcher, translator, texts[2:])
            while len(_waiting(batcher)) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.001)
            while not all(e.caches for e in _waiting(batcher)) and time.monotonic() < deadline:
                await asyncio.sleep(0.001)
            encoded_while_waiting = [bool(e.caches) for e in _waiting(batcher)]
            looked.set()
            done = await asyncio.wait_for(asyncio.gather(*first, *later), 60)
            return [d[0].text for d in done], encoded_while_waiting

    answers, encoded_while_waiting = asyncio.run(run())
    assert answers == _alone(translator, texts[:2], **LONG) + _alone(translator, texts[2:])
    assert encoded_while_waiting == [True, True]  # both still waiting for a place, both encoded
    assert {thread for thread, _, _ in calls} == {"onnxmt-encoder_0"}
    assert sum(n for _, n, _ in calls) == len(texts)  # each text encoded once
    assert ("onnxmt-encoder_0", 2, 2) in calls  # the two waiting in one call, while the first two ran


def test_a_request_that_fits_the_running_batch_is_encoded_as_it_arrives(
    tiny_onnx_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two places, one running, the encoder idle: of two requests arriving, the first fits, so the encoder thread
    encodes it as it arrives, alone, while the running one's steps go on, not after it is admitted; it joins
    encoded. The other, with no place, is not in that call. Each text is encoded once and every answer is the
    library's."""
    translator = Translator(tiny_onnx_dir)
    texts = TEXTS[50:53]
    encoding_at_admission: list[bool] = []  # per admitted request: was its encoder call started before?
    calls: list[int] = []
    real_encode, real_joins = inflight.encode_texts, InflightBatcher._joins

    def encode(graphs: Any, pad: int, ids: list[list[int]]) -> Any:
        calls.append(len(ids))
        return real_encode(graphs, pad, ids)

    def joins(self: InflightBatcher, admitted: list[tuple[Any, int]]) -> Any:
        for request, text in admitted:
            entry = self._entry(request)
            encoding_at_admission.append(text in entry.caches or text in entry.encoding)
        return real_joins(self, admitted)

    monkeypatch.setattr(inflight, "encode_texts", encode)
    monkeypatch.setattr(InflightBatcher, "_joins", joins)

    async def run() -> list[str]:
        async with _two_places(translator) as batcher:
            first = _send(batcher, translator, texts[:1], **LONG)
            deadline = time.monotonic() + 30
            while (batcher.scheduler.texts < 1 or batcher._open_calls) and time.monotonic() < deadline:
                await asyncio.sleep(0.001)  # running, and the encoder idle
            second = _send(batcher, translator, texts[1:])
            done = await asyncio.wait_for(asyncio.gather(*first, *second), 60)
            return [d[0].text for d in done]

    answers = asyncio.run(run())
    assert answers == _alone(translator, texts[:1], **LONG) + _alone(translator, texts[1:])
    assert encoding_at_admission[:2] == [False, True]  # the first joined an idle batch; the second came encoded
    assert calls[:2] == [1, 1]  # the one that fit was sent alone, not with the one that had no place
    assert sum(calls) == len(texts)  # each text encoded once


@pytest.mark.parametrize("failing", [1, 2], ids=["admitted", "waiting"])
def test_a_failed_encoder_call_fails_no_request(
    failing: int, tiny_onnx_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two places, four requests; one encoder call fails: that of the first two, admitted while it runs (they are
    encoded again as they join), or that of the two waiting (logged; they are encoded again before they join). All
    four answers are the library's: no request gets the error."""
    translator = Translator(tiny_onnx_dir)
    texts = TEXTS[40:44]
    calls: list[int] = []
    real = inflight.encode_texts

    def encode(graphs: Any, pad: int, ids: list[list[int]]) -> Any:
        calls.append(len(ids))
        if len(calls) == failing:
            raise RuntimeError("encoder out of memory")
        return real(graphs, pad, ids)

    monkeypatch.setattr(inflight, "encode_texts", encode)

    async def run() -> list[str]:
        async with _two_places(translator) as batcher:
            first = _send(batcher, translator, texts[:2], **LONG)
            deadline = time.monotonic() + 30
            while batcher.scheduler.texts < 2 and not any(f.done() for f in first) and time.monotonic() < deadline:
                await asyncio.sleep(0.001)
            later = _send(batcher, translator, texts[2:])
            done = await asyncio.wait_for(asyncio.gather(*first, *later), 60)
            return [d[0].text for d in done]

    answers = asyncio.run(run())
    assert calls[failing - 1] == 2  # the call that failed held two texts
    assert answers == _alone(translator, texts[:2], **LONG) + _alone(translator, texts[2:])


@pytest.mark.parametrize("reserve", [0, 1])
def test_a_one_text_request_beside_a_big_one_takes_a_place_at_once(tiny_onnx_dir: Path, reserve: int) -> None:
    """Four places, a request of 12 texts running (forced to 60 tokens): a one-text request sent meanwhile takes the
    reserved place past them at the next step, or with no reserve a place of the big request's (its text admitted
    last waits again), and is answered long before the big one. Every answer is the library's, a preempted text's
    included."""
    translator = Translator(tiny_onnx_dir)
    big_texts, small_text = TEXTS[:12], TEXTS[20]
    stats: list[inflight.StepStats] = []

    async def run() -> tuple[list[Any], list[Any], float, float]:
        executor = ThreadPoolExecutor(1, thread_name_prefix="onnxmt-inference")
        limits = BatchLimits(batch_size=4, reserve=reserve)
        batcher = InflightBatcher(translator, executor, limits=limits, max_queue=16, on_step=stats.append)
        batcher.start()
        try:
            big = asyncio.ensure_future(batcher.translate(translator.prepare(big_texts, beams=1, **LONG), None))
            deadline = time.monotonic() + 30
            while batcher.scheduler.texts < 4 and time.monotonic() < deadline:
                await asyncio.sleep(0.001)
            small = await batcher.translate(translator.prepare([small_text], beams=1, max_new_tokens=4), None)
            small_done = time.monotonic()
            assert not big.done(), "the big request finished first: nothing was tested"
            answer = await asyncio.wait_for(big, 120)
            return answer, small, small_done, time.monotonic()
        finally:
            await batcher.stop()
            executor.shutdown()

    big, small, small_done, big_done = asyncio.run(run())
    assert small_done < big_done
    preempted = sum(s.preempted for s in stats)
    assert preempted == 0 if reserve else preempted >= 1
    assert max(s.running_rows for s in stats) <= 4 + reserve  # the text budget held (one row a text)
    assert [t.text for t in small] == _alone(translator, [small_text], beams=1, max_new_tokens=4)
    assert [t.text for t in big] == [t.text for t in translator.translate(big_texts, beams=1, **LONG)]


def test_a_greedy_request_behind_queued_beam_requests_is_not_held_up_by_them(tiny_onnx_dir: Path) -> None:
    """Four places, three 4-text beam-4 requests (60 tokens): the first runs, two wait with no place; a one-text
    greedy request sent then takes the reserved place (the waiting ones cannot: they come first only among
    requests with nothing running, and do not fit), runs in the greedy batch that takes turns with the beam batch by
    request, and is answered before any beam request."""
    translator = Translator(tiny_onnx_dir)
    beam = {"beams": 4, **LONG}
    order: list[str] = []

    async def run() -> None:
        executor = ThreadPoolExecutor(1, thread_name_prefix="onnxmt-inference")
        batcher = InflightBatcher(translator, executor, limits=BatchLimits(batch_size=4), max_queue=16)
        batcher.start()

        async def send(name: str, texts: list[str], **options: Any) -> None:
            await batcher.translate(translator.prepare(texts, **options), None)
            order.append(name)

        try:
            beams = [asyncio.ensure_future(send(f"beam{i}", TEXTS[4 * i : 4 * i + 4], **beam)) for i in range(3)]
            deadline = time.monotonic() + 30
            while batcher.scheduler.texts < 4 and time.monotonic() < deadline:
                await asyncio.sleep(0.001)
            await send("greedy", [TEXTS[30]], beams=1, max_new_tokens=4)
            await asyncio.wait_for(asyncio.gather(*beams), 300)
        finally:
            await batcher.stop()
            executor.shutdown()

    asyncio.run(run())
    assert order[0] == "greedy"


@pytest.mark.parametrize("waiting", [4, 8])
def test_prompts_prefilled_ahead_of_their_place_hold_at_most_the_batch_budget(
    hy_mt_onnx_dir: Path, monkeypatch: pytest.MonkeyPatch, waiting: int
) -> None:
    """A decoder-only model's prompts waiting for a place are prefilled ahead (their caches ready when they join),
    but what they hold counts against the running batch's cost budget (--max-batch-cost, capped by --max-cache-mb):
    with `waiting` places (room for as many ahead) and a budget of one and a half long prompts, `waiting` long
    prompts behind two short texts are prefilled one at a time ahead, never two, however many wait (4, then 8);
    every answer is the library's alone."""
    translator = Translator(hy_mt_onnx_dir)
    long = [
        " ".join([f"Paragraph {i}: the committee met in the old town hall to discuss the river."] * 6)
        for i in range(waiting)
    ]
    short = TEXTS[40:42]
    options: dict[str, Any] = {"max_new_tokens": 8, "source_lang": "en", "target_lang": "zh"}
    running = {**options, **LONG}
    (big,) = translator.prepare([long[0]], **options)
    budget = big.cost * 3 // 2
    ahead: list[int] = []  # after each encoder call submitted: the cost of the waiting texts encoded ahead, or being
    submit = InflightBatcher._submit

    def counted(self: InflightBatcher, texts: list[tuple[Any, int]]) -> None:
        submit(self, texts)
        held = [(e, t) for e in self._entries.values() for t in (*e.caches, *e.encoding) if t in e.request.waiting]
        ahead.append(sum(e.request.costs[t] for e, t in held))

    monkeypatch.setattr(InflightBatcher, "_submit", counted)

    async def run() -> list[str]:
        executor = ThreadPoolExecutor(1, thread_name_prefix="onnxmt-inference")
        limits = BatchLimits(batch_size=waiting, max_batch_cost=budget, reserve=0)
        batcher = InflightBatcher(translator, executor, limits=limits, max_queue=16)
        batcher.start()
        try:
            first = [asyncio.ensure_future(batcher.translate(translator.prepare([t], **running), None)) for t in short]
            later = [asyncio.ensure_future(batcher.translate(translator.prepare([t], **options), None)) for t in long]
            done = await asyncio.wait_for(asyncio.gather(*first, *later), 120)
            return [d[0].text for d in done]
        finally:
            await batcher.stop()
            executor.shutdown()

    answers = asyncio.run(run())
    alone = [translator.translate([t], **running)[0].text for t in short]
    assert answers == alone + [translator.translate([t], **options)[0].text for t in long]
    assert max(ahead) > 0  # prompts were prefilled ahead of their place
    assert max(ahead) <= budget, (ahead, budget)
