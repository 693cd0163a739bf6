"""Hostile documents against a running `onnxmt serve`: zip and XML bombs, long unbroken text, blank-line floods,
many small cues, entity runs and unclosed markup. Each gets a 200 or a 4xx within seconds; the server's memory
(its process and its document workers) stays within twice its resting size; and a one-sentence /translate sent
meanwhile answers as fast as on the idle server (within 2x its idle median)."""

from __future__ import annotations

import statistics
import threading
import time

import httpx

from tests.helpers.server import Server, server_fixture
from tests.helpers.skips import importorskip

importorskip("docx")  # the uploads are built on a python-docx document

from tests.helpers.hostile import HOSTILE, tree_rss  # noqa: E402

SMALL = {"q": "Hello world.", "source": "en", "max_new_tokens": 8}


def small_latency(server: Server) -> float:
    started = time.perf_counter()
    response = httpx.post(f"{server.url}/translate", json=SMALL, timeout=60)
    assert response.status_code == 200, response.text
    return time.perf_counter() - started


# Uploads up to 4 MiB, so the bombs reach the document code instead of the body limit; the rest as shipped.
server = server_fixture("tiny_onnx_dir", log="hostile", max_body_bytes=4 << 20)


def test_hostile_documents_get_4xx_or_200_fast_in_bounded_memory_and_starve_no_one(server: Server) -> None:
    # Resting: after a translation and a document, so the worker has its modules and the tokenizer loaded.
    assert httpx.post(f"{server.url}/translate_file", files={"file": ("a.txt", b"Hi.")}, timeout=60).status_code == 200
    idle = statistics.median(small_latency(server) for _ in range(30))
    resting = tree_rss(server.process.pid)
    peak = resting
    sampling = True

    def sample() -> None:
        nonlocal peak
        while sampling:
            peak = max(peak, tree_rss(server.process.pid))
            time.sleep(0.02)

    answers: dict[str, tuple[int, float, str]] = {}

    def send(name: str) -> None:
        filename, data = HOSTILE[name]
        started = time.perf_counter()
        response = httpx.post(
            f"{server.url}/translate_file",
            files={"file": (filename, data)},
            data={"source": "en", "max_new_tokens": "4"},
            timeout=120,
        )
        answers[name] = (response.status_code, time.perf_counter() - started, response.text[:200])

    sampler = threading.Thread(target=sample)
    sampler.start()
    senders = [threading.Thread(target=send, args=(name,)) for name in HOSTILE]
    for thread in senders:
        thread.start()
    busy: list[float] = []
    while any(t.is_alive() for t in senders):
        busy.append(small_latency(server))
        time.sleep(0.05)
    sampling = False
    sampler.join()
    for name, (status, seconds, text) in answers.items():
        assert status == 200 or 400 <= status < 500, (name, status, text)
        assert seconds < 30, (name, seconds, text)
    assert answers["blank lines, then a sentence"][0] == 200
    for name in ("bzip2 zeros", "deflated zeros", "a member past its declared size", "1.5M empty paragraphs"):
        assert 400 <= answers[name][0] < 500, (name, answers[name])
    assert peak < 2 * resting, f"peak {peak / 2**20:.0f} MB against {resting / 2**20:.0f} MB resting"
    assert len(busy) >= 5, busy  # the uploads lasted long enough to measure beside them
    assert statistics.median(busy) < 2 * idle, f"{statistics.median(busy) * 1000:.0f} ms, idle {idle * 1000:.0f} ms"
