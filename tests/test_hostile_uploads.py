"""Hostile documents against a running `onnxmt serve`: zip and XML bombs, long unbroken text, blank-line floods,
many small cues, entity runs and unclosed markup. Each gets a 200 or a 4xx within seconds; the server's memory
(its process and its document workers) stays within twice its resting size; and a one-sentence /translate sent
meanwhile answers as fast as on the idle server (within 2x its idle median)."""

from __future__ import annotations

import bz2
import statistics
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from test_office_limits import HEAD, MIB, Member, deflated, deflated_zeros, many_paragraphs, with_members
from test_serve import Server, start_server

SMALL = {"q": "Hello world.", "source": "en", "max_new_tokens": 8}


def bzip2_zeros() -> bytes:
    zeros = bz2.BZ2Compressor(9)
    raw = b"".join(zeros.compress(bytes(MIB)) for _ in range(256)) + zeros.flush()  # 256 MiB in ~200 bytes
    return with_members(Member("word/document.xml", raw, 256 * MIB, 0, zipfile.ZIP_BZIP2))


def deflate_zeros() -> bytes:
    raw = deflated_zeros(HEAD, 1024)  # 1 GiB of zeros in a 1 MB upload
    return with_members(Member("word/document.xml", raw, len(HEAD) + 1024 * MIB, 0))


def lying_size() -> bytes:
    xml = HEAD + b"<w:document/>"
    return with_members(Member("word/document.xml", deflated_zeros(xml, 512), len(xml), 0))


def paragraph_flood() -> bytes:
    return with_members(deflated("word/document.xml", many_paragraphs(1_500_000)))


HOSTILE: dict[str, tuple[str, bytes]] = {
    "bzip2 zeros": ("a.docx", bzip2_zeros()),
    "deflated zeros": ("b.docx", deflate_zeros()),
    "a member past its declared size": ("c.docx", lying_size()),
    "1.5M empty paragraphs": ("d.docx", paragraph_flood()),
    "200k characters, no break": ("e.txt", b"a" * 200_000),
    "a 1 MB line of words": ("f.txt", b"word " * 200_000),
    "blank lines, then a sentence": ("g.txt", b"\n" * 1_000_000 + b"Hello there.\n"),
    "many small cues": ("h.srt", b"".join(b"%d\n00:00:01,000 --> 00:00:02,000\nHi.\n\n" % i for i in range(25_000))),
    "entity runs": ("i.html", b"<p>" + b"&a;" * 330_000 + b"</p>"),
    "an unclosed comment": ("j.html", b"<!--" + b"Hello there. " * 80_000),
    "an unclosed section": ("k.html", b"<![" + b"Hello there. " * 80_000),
    "backticks": ("l.md", b"`a` " * 250_000),
}


def tree_rss(pid: int) -> int:
    """Resident bytes of `pid` and every process under it (the document workers)."""
    total = 0
    todo = [pid]
    while todo:
        current = todo.pop()
        try:
            status = Path(f"/proc/{current}/status").read_text()
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        total += next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")) * 1024
        todo += [int(c) for c in children]
    return total


def small_latency(server: Server) -> float:
    started = time.perf_counter()
    response = httpx.post(f"{server.url}/translate", json=SMALL, timeout=60)
    assert response.status_code == 200, response.text
    return time.perf_counter() - started


@pytest.fixture(scope="module")
def server(tiny_onnx_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    # Uploads up to 4 MiB, so the bombs reach the document code instead of the body limit; the rest as shipped.
    running = start_server(tiny_onnx_dir, tmp_path_factory.mktemp("hostile"), max_body_bytes=4 << 20)
    yield running
    assert running.stop() == 0, running.logs()


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
