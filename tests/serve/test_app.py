"""The HTTP service, as a real `onnxmt serve` process on a free loopback port, talked to over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from onnxmt import DecodeOptions, Translator
from onnxmt.documents.translate import translate_document
from onnxmt.runtime.options import BatchLimits
from onnxmt.serve.options import ServeOptions
from tests.helpers import ROOT
from tests.helpers.browser import headless_chromium, translation_done
from tests.helpers.server import (
    ONNXMT,
    TEXTS,
    Server,
    assert_error,
    free_port,
    metric_sample,
    server_fixture,
    start_server,
)
from tests.helpers.skips import importorskip

KEYS = ("key-one", "key-two")


@pytest.fixture(scope="module")
def translator(tiny_multi_onnx_dir: Path) -> Translator:
    return Translator(tiny_multi_onnx_dir, batching=BatchLimits(16))


# The multi-target tiny model with small limits, so each limit is cheap to reach.
server = server_fixture(
    "tiny_multi_onnx_dir",
    log="serve",
    max_body_bytes=65536,
    max_chars=2000,
    max_texts=40,
    max_batch_size=16,
    batch_window_ms=20,
)
# API keys, a queue of one request and one text per decoder batch.
strict_server = server_fixture(
    "tiny_onnx_dir", log="serve-strict", api_keys=",".join(KEYS), max_queue=1, max_batch_size=1, batch_window_ms=0
)


def post(server: Server, body: Any = None, **kwargs: Any) -> httpx.Response:
    if body is not None:
        kwargs["json"] = body
    return httpx.post(f"{server.url}/translate", timeout=60, **kwargs)


def assert_serving(server: Server) -> None:
    response = post(server, {"q": TEXTS[0], "target": "cmn_Hans", "max_new_tokens": 5})
    assert response.status_code == 200, response.text


# --- translation -----------------------------------------------------------------------------------------------


def test_single_text_equals_library(server: Server, translator: Translator) -> None:
    cases = [("cmn_Hans", "cmn_Hans"), (">>yue_Hant<<", "yue_Hant"), ("zh", "cmn_Hans"), ("zt", "cmn_Hant")]
    cases += [("zh-TW", "cmn_Hant"), ("zho_Hans", "cmn_Hans"), ("yue", "yue"), (None, None)]
    for target, lang in cases:
        response = post(server, {"q": TEXTS[1], "source": "en", "target": target, "format": "text"})
        assert response.status_code == 200, response.text
        assert response.json() == {"translatedText": translator.translate([TEXTS[1]], target_lang=lang)[0].text}


def test_batch_equals_library(server: Server, translator: Translator) -> None:
    texts = [*TEXTS[:10], "", "  "]
    response = post(server, {"q": texts, "source": "auto", "target": "yue_Hant", "beams": 2, "max_new_tokens": 30})
    assert response.status_code == 200, response.text
    body = response.json()
    expected = translator.translate(texts, target_lang="yue_Hant", beams=2, max_new_tokens=30)
    assert body["translatedText"] == [t.text for t in expected]
    assert body["translatedText"][-2:] == ["", ""]
    # One detection for the batch (LibreTranslate's answer), by the detector (serve/detect.py).
    detected = body["detectedLanguage"]
    assert detected == [detected[0]] * len(texts) and detected[0]["language"] == "en"
    assert 50 < detected[0]["confidence"] <= 100


def test_detect(server: Server) -> None:
    english = httpx.post(f"{server.url}/detect", json={"q": "Hello, how are you today?"})
    assert english.status_code == 200, english.text
    candidates = english.json()
    assert candidates[0]["language"] == "en" and candidates[0]["confidence"] > 90
    assert [c["confidence"] for c in candidates] == sorted((c["confidence"] for c in candidates), reverse=True)
    sentence = "今天天气很好，我们去公园散步吧。"
    chinese = httpx.post(f"{server.url}/detect", data={"q": sentence}).json()
    assert chinese[0]["language"] == "zh"  # as /languages shows Simplified Chinese
    assert_error(httpx.post(f"{server.url}/detect", json={"q": 3}), 400)
    assert_error(httpx.post(f"{server.url}/detect", json={}), 400)
    # source "auto" is routed by the detector: Chinese is not what this model translates from.
    message = assert_error(post(server, {"q": sentence, "source": "auto", "target": "zh"}), 400)
    assert "the text is in zh" in message and "translates from en" in message
    auto = post(server, {"q": TEXTS[3], "source": "auto", "target": "zh"}).json()
    assert auto["detectedLanguage"]["language"] == "en"


def test_empty_batch(server: Server) -> None:
    response = post(server, {"q": [], "target": "cmn_Hans"})
    assert response.status_code == 200, response.text
    assert response.json()["translatedText"] == []


def test_form_bodies(server: Server, translator: Translator) -> None:
    expected = translator.translate(TEXTS[2:4], target_lang="cmn_Hans", beams=1)
    urlencoded = post(server, data={"q": TEXTS[2:4], "target": "cmn_Hans", "beams": "1"})
    assert urlencoded.status_code == 200, urlencoded.text
    assert urlencoded.json()["translatedText"] == [t.text for t in expected]
    multipart = post(server, files={"q": (None, TEXTS[2]), "target": (None, "cmn_Hans"), "beams": (None, "1")})
    assert multipart.status_code == 200, multipart.text
    assert multipart.json()["translatedText"] == expected[0].text


def test_alternatives(server: Server, translator: Translator) -> None:
    response = post(server, {"q": TEXTS[4], "target": "cmn_Hans", "alternatives": 2, "beams": 3})
    assert response.status_code == 200, response.text
    expected = translator.translate([TEXTS[4]], target_lang="cmn_Hans", beams=3, num_return_sequences=3)[0]
    assert response.json()["translatedText"] == expected.text
    assert response.json()["alternatives"] == [a.text for a in expected.alternatives]


def test_concurrent_requests_are_batched_and_exact(server: Server, translator: Translator) -> None:
    # Two targets and two beam sizes interleaved: settings that must never share a decoder batch.
    settings = [(target, beams) for target in ("cmn_Hans", "yue_Hant") for beams in (1, 3)]
    jobs = [(text, *settings[i % len(settings)]) for i, text in enumerate(TEXTS)]
    before = _metric(server, "onnxmt_batch_size_count", model="model")  # batch metrics are per model (its name)
    decoded = _metric(server, "onnxmt_translated_texts_total", model="model")

    async def send_all() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=len(jobs))
        async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as client:
            body = [{"q": text, "target": target, "beams": beams, "max_new_tokens": 20} for text, target, beams in jobs]
            return await asyncio.gather(*(client.post("/translate", json=b) for b in body))

    responses = asyncio.run(send_all())
    assert [r.status_code for r in responses] == [200] * len(jobs)
    for response, (text, target, beams) in zip(responses, jobs, strict=True):
        expected = translator.translate([text], target_lang=target, beams=beams, max_new_tokens=20)[0].text
        assert response.json()["translatedText"] == expected
    # Every text went through the decoder (none came from the translation cache), and shared batches.
    assert _metric(server, "onnxmt_translated_texts_total", model="model") - decoded == len(jobs)
    batches = _metric(server, "onnxmt_batch_size_count", model="model") - before
    assert batches < len(jobs), "no two requests shared a decoder batch"
    one = _metric(server, "onnxmt_batch_requests_bucket", le="1.0", model="model")
    assert one < _metric(server, "onnxmt_batch_requests_count", model="model")


def _metric(server: Server, name: str, **labels: str) -> float:
    return metric_sample(httpx.get(f"{server.url}/metrics", timeout=10).text, name, **labels)


# --- bad input -------------------------------------------------------------------------------------------------

BAD_JSON = {
    "malformed JSON": (b'{"q": "hello"', 400),
    "not an object": (b'["hello"]', 400),
    "not UTF-8": (b'{"q": "\xff"}', 400),
}
BAD_BODIES: dict[str, tuple[Any, int]] = {
    "missing q": ({"target": "cmn_Hans"}, 400),
    "q a number": ({"q": 3}, 400),
    "q null in a list": ({"q": ["a", None]}, 400),
    "q an object": ({"q": {"text": "a"}}, 400),
    "too many texts": ({"q": ["a"] * 41}, 400),
    "text too long": ({"q": "a" * 2001}, 400),
    "unknown target": ({"q": "a", "target": "fr"}, 400),
    "unknown source": ({"q": "a", "source": "de"}, 400),
    "target a number": ({"q": "a", "target": 1}, 400),
    "unknown format": ({"q": "a", "format": "xml"}, 400),
    "beams zero": ({"q": "a", "beams": 0}, 400),
    "beams too large": ({"q": "a", "beams": 9}, 400),
    "beams a string": ({"q": "a", "beams": "4"}, 400),
    "beams a boolean": ({"q": "a", "beams": True}, 400),
    "beams a float": ({"q": "a", "beams": 2.5}, 400),
    "alternatives negative": ({"q": "a", "alternatives": -1}, 400),
}


@pytest.mark.parametrize("case", BAD_JSON)
def test_malformed_body(server: Server, case: str) -> None:
    content, status = BAD_JSON[case]
    assert_error(post(server, content=content, headers={"Content-Type": "application/json"}), status)
    assert_serving(server)


@pytest.mark.parametrize("case", BAD_BODIES)
def test_bad_request(server: Server, case: str) -> None:
    body, status = BAD_BODIES[case]
    assert_error(post(server, body), status)
    assert_serving(server)


def test_max_new_tokens_beyond_the_model_is_capped_there(server: Server) -> None:
    # As transformers caps (and warns): the model's positions are the most it can generate.
    capped = post(server, {"q": "a", "max_new_tokens": 1000})
    at_the_limit = post(server, {"q": "a", "max_new_tokens": 64})  # the tiny model's positions
    assert capped.status_code == 200 and capped.json() == at_the_limit.json()
    assert_serving(server)


def test_bad_form_and_content_type(server: Server) -> None:
    assert_error(post(server, data={"q": "a", "beams": "many"}), 400)
    assert_error(post(server, files={"q": ("q.txt", b"hello")}), 400)
    assert_error(post(server, content=b"q=a", headers={"Content-Type": "text/plain"}), 400)
    assert_serving(server)


def test_body_too_large(server: Server) -> None:
    body = json.dumps({"q": ["word " * 400] * 40}).encode()  # within the text limits, above the 64 KiB body limit
    message = assert_error(post(server, content=body, headers={"Content-Type": "application/json"}), 413)
    assert "65536" in message

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit is enforced while reading
        for start in range(0, len(body), 8192):
            yield body[start : start + 8192]

    assert_error(post(server, content=chunks(), headers={"Content-Type": "application/json"}), 413)
    assert_serving(server)


def test_unknown_routes_and_methods(server: Server) -> None:
    assert_error(httpx.get(f"{server.url}/translate"), 405)
    assert_error(httpx.get(f"{server.url}/no/such/page"), 404)
    assert_serving(server)


# --- the other endpoints -----------------------------------------------------------------------------------------


def test_health_ready_languages_info(server: Server) -> None:
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
    assert httpx.get(f"{server.url}/ready").json() == {"ready": True}
    languages = httpx.get(f"{server.url}/languages").json()
    # LibreTranslate >= 1.7's zh-Hans / zh-Hant beside the zh / zt older clients know (docs/serve.md).
    targets = ["zh", "zh-Hans", "zt", "zh-Hant", "cjy-Hans", "cjy-Hant", "cmn", "gan", "lzh", "lzh-Hans", "nan"]
    targets += ["wuu", "yue", "yue-Hans", "yue-Hant"]
    assert languages[0] == {"code": "en", "name": "English", "targets": targets}
    assert [entry["code"] for entry in languages[1:]] == targets
    assert languages[1:5] == [
        {"code": "zh", "name": "Chinese (Simplified)", "targets": []},
        {"code": "zh-Hans", "name": "Chinese (Simplified)", "targets": []},
        {"code": "zt", "name": "Chinese (Traditional)", "targets": []},
        {"code": "zh-Hant", "name": "Chinese (Traditional)", "targets": []},
    ]
    info = httpx.get(f"{server.url}/info").json()
    assert info["model"]["architecture"] == "marian"
    assert info["limits"]["max_chars"] == 2000 and info["batching"]["max_batch_size"] == 16
    assert info["batching"]["batch_invariant"] is True  # fp32
    assert info["api_keys"] is False


def test_docs_and_page(server: Server) -> None:
    schema = httpx.get(f"{server.url}/openapi.json").json()
    assert {"/translate", "/detect", "/languages", "/info", "/health", "/ready", "/metrics"} <= set(schema["paths"])
    assert "application/x-www-form-urlencoded" in schema["paths"]["/translate"]["post"]["requestBody"]["content"]
    assert httpx.get(f"{server.url}/docs").status_code == 200
    page = httpx.get(f"{server.url}/")
    assert page.status_code == 200 and 'id="translate"' in page.text


def test_metrics(server: Server) -> None:
    assert_serving(server)
    text = httpx.get(f"{server.url}/metrics").text
    for name in (
        'onnxmt_requests_total{path="/translate",status="200"}',
        "onnxmt_request_duration_seconds_bucket",
        "onnxmt_batch_size_bucket",
        "onnxmt_queue_depth",
        "onnxmt_generated_tokens_total",
        "onnxmt_ready 1.0",
    ):
        assert name in text


# --- queue, keys, timeout, shutdown, start-up ------------------------------------------------------------------


def test_api_keys(strict_server: Server) -> None:
    body = {"q": TEXTS[0], "max_new_tokens": 5}
    assert "api_key" in assert_error(post(strict_server, body), 403)
    assert_error(post(strict_server, {**body, "api_key": "wrong"}), 403)
    assert_error(post(strict_server, {**body, "api_key": 1}), 403)
    assert post(strict_server, {**body, "api_key": KEYS[1]}).status_code == 200
    assert post(strict_server, data={"q": TEXTS[0], "api_key": KEYS[0], "max_new_tokens": "5"}).status_code == 200
    assert httpx.get(f"{strict_server.url}/health").status_code == 200
    assert httpx.get(f"{strict_server.url}/info").json()["api_keys"] is True


def test_queue_full_gives_503(strict_server: Server) -> None:
    # Each request keeps the single inference thread busy for a while (8 texts, one per decoder batch, 4 beams).
    body = {"q": TEXTS[:8], "beams": 4, "api_key": KEYS[0]}

    async def send_all() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=strict_server.url, timeout=120) as client:
            return await asyncio.gather(*(client.post("/translate", json=body) for _ in range(12)))

    responses = asyncio.run(send_all())
    statuses = [r.status_code for r in responses]
    assert set(statuses) == {200, 503}, statuses
    for response in responses:
        if response.status_code == 503:
            assert "queue is full" in assert_error(response, 503)
            assert response.headers["Retry-After"] == "1"
    assert post(strict_server, {**body, "q": "a"}).status_code == 200


def test_timeout_gives_504(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    server = start_server(tiny_onnx_dir, tmp_path, timeout=0.001, batch_window_ms=50)
    try:
        assert "timed out" in assert_error(post(server, {"q": TEXTS[0]}), 504)
        assert httpx.get(f"{server.url}/health").status_code == 200
    finally:
        assert server.stop() == 0, server.logs()


def test_sigterm_finishes_requests_in_flight(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    server = start_server(tiny_onnx_dir, tmp_path, max_batch_size=2, batch_window_ms=0)
    body = {"q": TEXTS[:6], "beams": 4}
    signalled = 0.0

    async def send_and_stop() -> list[tuple[httpx.Response, float]]:
        nonlocal signalled
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:

            async def timed() -> tuple[httpx.Response, float]:
                response = await client.post("/translate", json=body)
                return response, time.monotonic()

            tasks = [asyncio.create_task(timed()) for _ in range(8)]
            # All 8 are in the server when 1 runs and the other 7 are queued or done (one request per batch here).
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                metrics = await client.get("/metrics")
                if (
                    metric_sample(metrics.text, "onnxmt_queue_depth", model="model")
                    + metric_sample(metrics.text, "onnxmt_batch_requests_count", model="model")
                    >= 7
                ):
                    break
                await asyncio.sleep(0.01)
            signalled = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            return await asyncio.gather(*tasks)

    results = asyncio.run(send_and_stop())
    code = server.process.wait(timeout=60)
    assert code == 0, server.logs()
    expected = Translator(tiny_onnx_dir).translate(TEXTS[:6], beams=4)
    for response, _ in results:
        assert response.status_code == 200, response.text
        assert response.json()["translatedText"] == [t.text for t in expected]
    assert any(done > signalled for _, done in results), "every request finished before SIGTERM: nothing was tested"
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{server.url}/health")


def test_sigterm_with_long_batches_answers_every_request_and_exits_in_time(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    timeout = 2.0
    server = start_server(tiny_onnx_dir, tmp_path, timeout=timeout, max_texts=64, batch_window_ms=0)
    # Each request is a long batch (64 texts at 8 beams); 16 of them are more work than fits in the timeout, on a
    # fast machine too.
    heavy = {"q": TEXTS, "beams": 8}

    async def send_and_stop() -> tuple[list[httpx.Response | BaseException], httpx.Response, float]:
        async with (
            httpx.AsyncClient(base_url=server.url, timeout=60) as client,
            httpx.AsyncClient(base_url=server.url, timeout=60, limits=httpx.Limits(max_connections=1)) as idle,
        ):
            assert (await idle.post("/translate", json={"q": "a", "max_new_tokens": 3})).status_code == 200
            tasks = [
                asyncio.create_task(client.post("/translate", json={**heavy, "max_new_tokens": 63 - i}))
                for i in range(16)
            ]  # different settings: one batch each
            await asyncio.sleep(0.5)
            server.process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            await asyncio.sleep(0.3)
            # A request on a keep-alive connection opened before SIGTERM: answered, and told to close.
            late = await idle.post("/translate", json={"q": "a", "max_new_tokens": 3})
            return await asyncio.gather(*tasks, return_exceptions=True), late, signalled

    results, late, signalled = asyncio.run(send_and_stop())
    try:
        code = server.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.process.kill()  # never left behind ignoring signals
        pytest.fail(f"the server had not exited 60 s after SIGTERM:\n{server.logs()[-6000:]}")
    exited = time.monotonic() - signalled
    assert code == 0, server.logs()
    assert exited < timeout + 5, exited
    statuses = [r.status_code if isinstance(r, httpx.Response) else repr(r) for r in results]
    assert set(statuses) <= {200, 503} and 503 in statuses, statuses
    for response in results:
        assert isinstance(response, httpx.Response)
        if response.status_code == 503:
            assert "shutting down" in assert_error(response, 503) and response.headers["Retry-After"] == "1"
    assert "shutting down" in assert_error(late, 503)
    assert late.headers["connection"] == "close"


def test_model_that_cannot_load_exits_2(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    missing = subprocess.run([*ONNXMT, "serve", str(tmp_path / "missing")], capture_output=True, text=True)
    assert missing.returncode == 2 and "not found" in missing.stderr
    bad_setting = subprocess.run(
        [*ONNXMT, "serve", str(tiny_onnx_dir), "--max-queue", "0"], capture_output=True, text=True, timeout=60
    )
    assert bad_setting.returncode == 2 and "max_queue must be at least 1" in bad_setting.stderr
    broken = tmp_path / "broken"
    shutil.copytree(tiny_onnx_dir, broken)
    (broken / "decoder.onnx").write_bytes(b"not a model")
    port = str(free_port())
    result = subprocess.run(
        [*ONNXMT, "serve", str(broken), "--port", port],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert "decoder.onnx" in result.stderr


def test_cli_defaults_are_serve_options_defaults() -> None:
    from onnxmt.cli import serve

    parameters = inspect.signature(serve).parameters
    for field in fields(ServeOptions):
        if field.name in ("api_keys", "cors_origins"):
            assert parameters[field.name].default is None
        else:
            assert parameters[field.name].default == field.default, field.name


# --- in process: timeouts, disconnects, the cost budget, start-up ------------------------------------------


@contextlib.contextmanager
def serve_in_thread(model_dir: Path, options: ServeOptions, decoding: DecodeOptions) -> Iterator[str]:
    """The app under uvicorn on a thread of this process (settings the CLI has no flag for, such as min_new_tokens)."""
    import uvicorn

    from onnxmt.serve.app import create_app

    port = free_port()
    config = uvicorn.Config(create_app(model_dir, options, decoding=decoding), port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                    break
            time.sleep(0.05)
        yield url
    finally:
        server.should_exit = True
        thread.join(30)


# 256 texts at 8 beams, every text forced to 63 tokens: ~12 s of work on the tiny model, 2 cores.
HEAVY = {"q": [f"{TEXTS[i % 64]} {i}" for i in range(256)], "beams": 8}  # 256 different texts: none deduplicated
FORCED = DecodeOptions(max_new_tokens=63, min_new_tokens=63)


def test_a_heavy_request_that_times_out_stops_blocking(tiny_onnx_dir: Path) -> None:
    options = ServeOptions(timeout=1, max_texts=256, max_request_cost=0, batch_window_ms=0)
    with serve_in_thread(tiny_onnx_dir, options, FORCED) as url:

        async def main() -> tuple[httpx.Response, httpx.Response, float]:
            async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                start = time.monotonic()
                heavy = asyncio.create_task(client.post("/translate", json=HEAVY))
                await asyncio.sleep(0.8)
                small = await client.post("/translate", json={"q": "a", "max_new_tokens": 3})
                return await heavy, small, time.monotonic() - start

        heavy, small, took = asyncio.run(main())
    assert "timed out" in assert_error(heavy, 504)
    assert small.status_code == 200, small.text
    assert took < 1 + 1.5, took  # the heavy request's work stopped at its timeout


def test_metrics_list_what_runs_at_zero_before_the_first_request(tiny_onnx_dir: Path) -> None:
    with serve_in_thread(tiny_onnx_dir, ServeOptions(), DecodeOptions()) as url:
        metrics = httpx.get(f"{url}/metrics").text
    names = ("onnxmt_queue_depth", "onnxmt_running_rows", "onnxmt_running_requests", "onnxmt_preempted_texts_total")
    for name in names:
        assert metric_sample(metrics, name, model="model") == 0


def test_a_static_batch_shows_its_rows_and_requests_running(tiny_concat_onnx_dir: Path) -> None:
    """A model with static batches (its decoder takes one cache length for all rows) shows what runs too, not only
    what waits: its decoder batch's rows (texts x beams) and its requests while the batch runs, 0 once done."""
    options = ServeOptions(max_request_cost=0, batch_window_ms=0)
    body = {"q": TEXTS[:8], "beams": 4}
    with serve_in_thread(tiny_concat_onnx_dir, options, FORCED) as url:
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(httpx.post, f"{url}/translate", json=body, timeout=60)
            seen = set()
            while not answer.done():
                metrics = httpx.get(f"{url}/metrics").text
                rows = metric_sample(metrics, "onnxmt_running_rows", model="model")
                seen.add((rows, metric_sample(metrics, "onnxmt_running_requests", model="model")))
            assert answer.result().status_code == 200, answer.result().text
        metrics = httpx.get(f"{url}/metrics").text
    assert (8 * 4, 1) in seen, seen
    assert seen <= {(0, 0), (8 * 4, 1)}, seen
    assert metric_sample(metrics, "onnxmt_running_rows", model="model") == 0
    assert metric_sample(metrics, "onnxmt_running_requests", model="model") == 0


def test_a_client_that_disconnects_cancels_its_work(tiny_onnx_dir: Path) -> None:
    options = ServeOptions(timeout=60, max_texts=256, max_request_cost=0, batch_window_ms=0)
    with serve_in_thread(tiny_onnx_dir, options, FORCED) as url:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/translate", json=HEAVY, timeout=0.5)  # closes its connection
        start = time.monotonic()
        small = httpx.post(f"{url}/translate", json={"q": "a", "max_new_tokens": 3}, timeout=60)
        took = time.monotonic() - start
        metrics = httpx.get(f"{url}/metrics").text
    assert small.status_code == 200, small.text
    assert took < 1.5, took
    assert metric_sample(metrics, "onnxmt_requests_total", path="/translate", status="499") == 1


def test_the_cost_budget_gives_413_naming_the_limit(tiny_onnx_dir: Path) -> None:
    from fastapi.testclient import TestClient

    from onnxmt.serve.app import create_app

    with TestClient(create_app(tiny_onnx_dir, ServeOptions(max_request_cost=10000))) as client:
        deadline = time.monotonic() + 30
        while client.get("/ready").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        # The request, scaled to the tiny model: 16 texts of 5,000 characters at 8 beams.
        body = {"q": ["word " * 1000] * 16, "beams": 8, "max_new_tokens": 63}
        message = assert_error_body(client.post("/translate", json=body), 413)
        assert "16256 tokens x beams" in message and "the limit is 10000" in message, message
        assert client.post("/translate", json={**body, "q": body["q"][:4]}).status_code == 200
        assert client.get("/info").json()["limits"]["max_request_cost"] == 10000


def test_cache_bytes_per_token_from_the_real_configs() -> None:
    from types import SimpleNamespace

    from onnxmt.serve.costs import cache_bytes_per_cost

    def per_token(layers: int, heads: int, head_dim: int, kv_heads: int | None = None) -> int:
        facts = {"num_layers": layers, "num_heads": heads, "head_dim": head_dim}
        if kv_heads is not None:
            facts["num_kv_heads"] = kv_heads
        return cache_bytes_per_cost(SimpleNamespace(model=facts))  # type: ignore[arg-type]

    assert per_token(6, 8, 64) == 24 * 1024  # opus-mt-en-zh: 6 decoder layers, d_model 512
    assert per_token(24, 16, 128) == 384 * 1024  # NLLB-200-3.3B: 24 layers, d_model 2048
    assert per_token(32, 16, 128) == 512 * 1024  # MADLAD-400-3B: 32 layers, 16 heads of d_kv 128
    assert per_token(32, 16, 128, 4) == 128 * 1024  # HY-MT1.5-1.8B: its cache holds 4 key-value heads of 16


def test_max_cache_mb_caps_both_costs_per_model(tiny_onnx_dir: Path) -> None:
    from fastapi.testclient import TestClient

    from onnxmt.runtime.modeldir import load_manifest
    from onnxmt.serve.app import create_app
    from onnxmt.serve.costs import cache_bytes_per_cost, cost_limits

    manifest = load_manifest(tiny_onnx_dir)
    per_token = cache_bytes_per_cost(manifest)
    options = ServeOptions(max_cache_mb=1000 * per_token / 2**20, max_request_cost=10000, max_batch_cost=20000)
    # The cap doubles with the setting (twice the megabytes, twice the tokens x beams); the cost limits still apply.
    for tokens in (1000, 2000, 4000, 8000, 16000):
        limits = cost_limits(manifest, replace(options, max_cache_mb=tokens * per_token / 2**20))
        assert limits[1:] == (tokens, min(tokens, 10000), min(tokens, 20000))
    with TestClient(create_app(tiny_onnx_dir, options)) as client:
        deadline = time.monotonic() + 30
        while client.get("/ready").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        limits = client.get("/info").json()["models"][0]["cost_limits"]
        assert limits == {"cache_bytes_per_token": per_token, "cap": 1000, "request": 1000, "batch": 1000}
        body = {"q": ["word " * 100] * 4, "beams": 2, "max_new_tokens": 63}
        message = assert_error_body(client.post("/translate", json=body), 413)
        assert "the limit is 1000 (max_cache_mb:" in message and "KB per token x beam" in message, message
        assert client.post("/translate", json={**body, "q": body["q"][:1], "beams": 1}).status_code == 200
        entry = client.app.state.service.catalog.entries[0]  # type: ignore[attr-defined]
        assert entry.batcher is not None and entry.batcher.limits.max_batch_cost == 1000
    with TestClient(create_app(tiny_onnx_dir, ServeOptions(max_cache_mb=0, max_request_cost=10000))) as client:
        deadline = time.monotonic() + 30
        while client.get("/ready").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        limits = client.get("/info").json()["models"][0]["cost_limits"]
        assert limits == {"cache_bytes_per_token": per_token, "cap": None, "request": 10000, "batch": 65536}


def test_ready_only_once_the_model_is_loaded(tiny_onnx_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fastapi.testclient import TestClient

    from onnxmt.serve import loading
    from onnxmt.serve.app import create_app

    gate = threading.Event()
    load = loading.Translator

    def slow_load(*args: Any) -> Translator:
        gate.wait(30)
        return load(*args)

    monkeypatch.setattr(loading, "Translator", slow_load)
    with TestClient(create_app(tiny_onnx_dir, ServeOptions())) as client:
        assert client.get("/health").status_code == 200
        assert "loading" in assert_error_body(client.get("/ready"), 503)
        loading = client.post("/translate", json={"q": "a"})
        assert "loading" in assert_error_body(loading, 503) and loading.headers["Retry-After"] == "1"
        assert_error_body(client.get("/languages"), 503)
        gate.set()
        deadline = time.monotonic() + 30
        while client.get("/ready").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.post("/translate", json={"q": "a", "max_new_tokens": 3}).status_code == 200


def assert_error_body(response: httpx.Response, status: int) -> str:
    """Like assert_error, for answers that may carry more than the error (/ready says `ready: false` too)."""
    assert response.status_code == status, response.text
    return str(response.json()["error"])


# --- the page in a real browser --------------------------------------------------------------------------------


def test_page_translates_in_headless_chromium(server: Server, translator: Translator, tmp_path: Path) -> None:
    browser = headless_chromium(tmp_path / "profile")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    try:
        browser.get(f"{server.url}/")
        wait = WebDriverWait(browser, 30)
        wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, "#target option")) == 13)
        Select(browser.find_element(By.ID, "target")).select_by_value("yue-Hant")  # as /languages lists it
        # A text the 13-token fixture translates into yue_Hant as a non-empty text (TEXTS[5] gives "").
        browser.find_element(By.ID, "text").send_keys(TEXTS[8])
        browser.find_element(By.ID, "translate").click()
        # The page reads /translate/stream: done when its status clears, the whole text shown.
        wait.until(translation_done)
        browser.save_screenshot(str(tmp_path / "page.png"))
        shown = browser.find_element(By.ID, "result").get_attribute("textContent")
        assert shown and shown == translate_document(translator, TEXTS[8], target_lang="yue_Hant")
        fetched = browser.execute_script("return performance.getEntriesByType('resource').map((e) => e.name)")
        assert any(name.endswith("/translate/stream") for name in fetched), fetched
        assert browser.find_element(By.ID, "error").text == ""
        violations = [e["message"] for e in browser.get_log("browser") if "Content Security Policy" in e["message"]]
        assert not violations, violations
    finally:
        browser.quit()


# --- the load benchmark ----------------------------------------------------------------------------------------


def test_load_script(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    script = ROOT / "benchmarks" / "bench.py"
    command = [sys.executable, str(script), "load", str(tiny_onnx_dir), "--concurrency", "1", "4", "--requests", "8"]
    command += ["--duration", "30", "--max-new-tokens", "5", "--name", "test", "--out", str(tmp_path)]
    out = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads((tmp_path / "load-test.json").read_text())
    assert [(level["concurrency"], level["ok"], level["errors"]) for level in result["levels"]] == [
        (1, 8, 0),
        (4, 8, 0),
    ]
    assert result["server_exit_code"] == 0 and result["server_rss_end_mb"]["rss_mb"] > 0
    assert "| 4 | 8 | 0 |" in out.stdout


def test_an_export_without_bit_exact_rows_says_batches_can_change_a_translation(
    tiny_onnx_dir: Path, tmp_path: Path
) -> None:
    # Exports whose decoder puts the new token's score last (before `rows_bit_exact`) run in flight with logits
    # that can move in the last bits with the batch: /info and the start log say so, and what to do.
    from onnxmt.runtime.capabilities import Capabilities
    from onnxmt.runtime.modeldir import load_manifest

    assert load_manifest(tiny_onnx_dir).model["rows_bit_exact"] is True
    assert Capabilities.of(load_manifest(tiny_onnx_dir)).batch_invariant(16) is True
    older = tmp_path / "older"
    shutil.copytree(tiny_onnx_dir, older)
    data = json.loads((older / "onnxmt.json").read_text())
    del data["model"]["rows_bit_exact"]
    (older / "onnxmt.json").write_text(json.dumps(data))
    manifest = load_manifest(older)
    assert Capabilities.of(manifest).batch_invariant(16) is False
    assert Capabilities.of(manifest).batch_invariant(1) is True  # nothing to be batched with
    assert "export the model again" in Capabilities.of(manifest).variant_batches


@pytest.mark.parametrize(
    ("per_row", "max_batch_size", "expected"), [(False, 16, False), (False, 1, True), (True, 16, True)]
)
def test_info_says_whether_batches_can_change_a_translation(
    tiny_onnx_dir: Path, tmp_path: Path, per_row: bool, max_batch_size: int, expected: bool
) -> None:
    # Per-tensor int8 scales depend on the batch; a batch of one, or a scale per row, does not.
    importorskip("onnx")
    from onnxmt.export.quantize import QuantizeOptions, quantize
    from onnxmt.runtime.capabilities import Capabilities
    from onnxmt.runtime.modeldir import load_manifest

    int8 = tmp_path / "int8"
    quantize(tiny_onnx_dir, int8, QuantizeOptions(per_row_scales=per_row), progress=lambda _: None)
    # Read from the manifest: /info says it for every model, loaded or not.
    assert Capabilities.of(load_manifest(int8)).batch_invariant(max_batch_size) is expected
