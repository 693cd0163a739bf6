"""serve/documents.py over HTTP: `format: "html"`, /translate_file and /download_file, /translate/stream."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from onnxmt import DecodeOptions, Translator
from onnxmt.documents import translate_document, translate_file, translate_string
from onnxmt.documents.html import parse
from onnxmt.documents.subtitles import cues
from onnxmt.testing import generate_corpus
from tests.helpers.server import Server, server_fixture, start_server
from tests.helpers.skips import importorskip

KEY = "document-key"
ENGLISH = generate_corpus(11, lines=12)[0]
TEXT = " ".join(ENGLISH[:3]) + "\n\n" + " ".join(ENGLISH[3:6]) + "\n"
PAGE = (
    '<html><head><title>A page title</title><script>var x = "<b>";</script></head><body>'
    '<h1 class="big">Hello world</h1><p>Some <b>bold</b> words and <a href="/a?b=1&amp;c=2">a link</a>. '
    "One more sentence.</p><pre>keep this</pre></body></html>"
)
SRT = "1\n00:00:01,000 --> 00:00:02,000\nHello there,\nmy friend.\n\n2\n00:00:03,000 --> 00:00:04,500\nGood bye.\n"


@pytest.fixture(scope="module")
def translator(tiny_onnx_dir: Path) -> Translator:
    return Translator(tiny_onnx_dir, decoding=DecodeOptions(max_new_tokens=6))


server = server_fixture("tiny_onnx_dir", log="serve-documents", api_keys=KEY, max_body_bytes=65536)


def upload(server: Server, name: str, data: bytes, **fields: str) -> httpx.Response:
    fields = {"source": "en", "api_key": KEY, "max_new_tokens": "6", **fields}
    return httpx.post(f"{server.url}/translate_file", files={"file": (name, data)}, data=fields, timeout=120)


def download(response: httpx.Response) -> bytes:
    assert response.status_code == 200, response.text
    assert set(response.json()) == {"translatedFileUrl"}
    got = httpx.get(response.json()["translatedFileUrl"], timeout=30)
    assert got.status_code == 200, got.text
    return got.content


def test_html_format_keeps_markup_and_equals_the_library(server: Server, translator: Translator) -> None:
    body = {"q": PAGE, "source": "en", "format": "html", "api_key": KEY, "max_new_tokens": 6}
    response = httpx.post(f"{server.url}/translate", json=body, timeout=60)
    assert response.status_code == 200, response.text
    out = response.json()["translatedText"]
    assert out == translate_string(translator, PAGE, "html")
    assert [e.raw for e in parse(out) if e.kind != "data"] == [e.raw for e in parse(PAGE) if e.kind != "data"]
    batch = httpx.post(f"{server.url}/translate", json={**body, "q": [PAGE, "<p>Hi</p>"]}, timeout=60).json()
    assert batch["translatedText"][0] == out and batch["translatedText"][1].startswith("<p>")


@pytest.mark.parametrize(("name", "content"), [("notes.txt", TEXT), ("page.html", PAGE), ("talk.srt", SRT)])
def test_translate_file_round_trips(
    server: Server, translator: Translator, tmp_path: Path, name: str, content: str
) -> None:
    got = download(upload(server, name, content.encode()))
    (tmp_path / name).write_text(content, encoding="utf-8")
    translate_file(translator, tmp_path / name, tmp_path / f"out-{name}")
    assert got == (tmp_path / f"out-{name}").read_bytes()
    text = got.decode()
    if name.endswith(".srt"):
        assert [head for head, _ in cues(text)] == [head for head, _ in cues(content)]
    elif name.endswith(".html"):
        assert [e.raw for e in parse(text) if e.kind != "data"] == [e.raw for e in parse(content) if e.kind != "data"]
    else:
        assert text.count("\n") == content.count("\n")


def test_translate_file_docx_keeps_styles_and_runs(server: Server, tmp_path: Path) -> None:
    importorskip("docx")
    from tests.helpers.office import docx_structure, make_docx

    make_docx(tmp_path / "in.docx")
    response = upload(server, "report.docx", (tmp_path / "in.docx").read_bytes())
    (tmp_path / "out.docx").write_bytes(download(response))
    assert docx_structure(tmp_path / "out.docx") == docx_structure(tmp_path / "in.docx")
    assert response.json()["translatedFileUrl"].endswith(".report.docx")


def test_translated_file_url_follows_the_clients_host_unless_it_is_not_one(server: Server) -> None:
    # Without --public-url the URL is built from the client's own Host (docs/serve.md); a Host that is no host
    # name with a port gives a URL relative to the service, not one built from whatever the client sent.
    port = server.url.rsplit(":", 1)[1]
    for host, start in (
        (f"127.0.0.1:{port}", f"http://127.0.0.1:{port}/download_file/"),
        ("translate.example.com", "http://translate.example.com/download_file/"),
        ("[::1]:8080", "http://[::1]:8080/download_file/"),
        ("evil.example/x?", "/download_file/"),
        ("user@evil.example", "/download_file/"),
    ):
        response = httpx.post(
            f"{server.url}/translate_file",
            files={"file": ("a.txt", b"Hello.")},
            data={"source": "en", "api_key": KEY, "max_new_tokens": "4"},
            headers={"Host": host},
            timeout=60,
        )
        assert response.status_code == 200, response.text
        url = response.json()["translatedFileUrl"]
        assert url.startswith(start) and url.endswith(".a.txt"), (host, url)
    assert httpx.get(server.url + url, timeout=30).status_code == 200


def test_translate_file_refusals_are_4xx(server: Server) -> None:
    url = f"{server.url}/translate_file"
    cases = [
        httpx.post(url, files={"file": ("a.txt", b"hi")}, data={"api_key": "wrong"}),
        httpx.post(url, files={"file": ("a.txt", b"hi")}),
        httpx.post(url, data={"api_key": KEY}),
        httpx.post(url, json={"api_key": KEY, "file": "x"}),
        httpx.post(url, files={"file": ("a.pdf", b"%PDF")}, data={"api_key": KEY}),
        httpx.post(url, files={"file": ("", b"hi")}, data={"api_key": KEY}),
        httpx.post(url, files={"file": ("a.docx", b"not a zip")}, data={"api_key": KEY}),
        httpx.post(url, files={"file": ("a.html", b"\xff\xfe\x00bad")}, data={"api_key": KEY}),
        httpx.post(url, files={"file": ("a.txt", b"x" * 70000)}, data={"api_key": KEY}),
        httpx.post(url, files={"file": ("a.txt", b"hi"), "q": ("b.txt", b"x")}, data={"api_key": KEY}),
        httpx.post(url, files={"file": ("a.txt", b"hi")}, data={"api_key": KEY, "beams": "many"}),
        httpx.post(url, files={"file": ("a.txt", b"hi")}, data={"api_key": KEY, "target": "xx"}),
        httpx.post(url, files={"file": ("a.html", b"<![<p>")}, data={"api_key": KEY}),
        httpx.post(f"{server.url}/translate", json={"q": "<![<p>", "format": "html", "api_key": KEY}),
    ]
    statuses = [r.status_code for r in cases]
    assert statuses == [403, 403, 400, 400, 400, 400, 400, 400, 413, 400, 400, 400, 400, 400], [r.text for r in cases]
    assert all(set(r.json()) == {"error"} for r in cases)
    for name in ("nothing.txt", "..%2F..%2Fetc%2Fpasswd", "0" * 32 + ".x.txt"):
        missing = httpx.get(f"{server.url}/download_file/{name}")
        assert missing.status_code == 404 and "error" in missing.json()


def sse(response: httpx.Response) -> list[tuple[str, dict]]:
    events = []
    for block in response.text.split("\n\n"):
        if not block.strip():
            continue
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        events.append((lines.get("event", "message"), json.loads(lines["data"])))
    return events


def test_stream_sends_sentences_then_the_whole_translation(server: Server, translator: Translator) -> None:
    body = {"q": TEXT, "source": "en", "api_key": KEY, "max_new_tokens": 6}
    response = httpx.post(f"{server.url}/translate/stream", json=body, timeout=60)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = sse(response)
    pieces = [data["translatedText"] for kind, data in events if kind == "message"]
    assert events[-1][0] == "done"
    assert "".join(pieces) == events[-1][1]["translatedText"] == translate_document(translator, TEXT)
    assert len(pieces) >= 6  # one event a sentence (and the trailing line break)


def test_greedy_stream_sends_tokens_as_the_running_batch_makes_them(server: Server, translator: Translator) -> None:
    """Greedy search on an in-flight model: the pieces come token by token (the last held back until the next
    shows it does not join a word), and join to what the library translates."""
    body = {"q": TEXT, "source": "en", "api_key": KEY, "max_new_tokens": 12, "beams": 1}
    events = sse(httpx.post(f"{server.url}/translate/stream", json=body, timeout=60))
    pieces = [data["translatedText"] for kind, data in events if kind == "message"]
    assert events[-1][0] == "done"
    expected = translate_document(translator, TEXT, beams=1, max_new_tokens=12)
    assert "".join(pieces) == events[-1][1]["translatedText"] == expected
    # The first sentence is decoded alone and streamed token by token: as many pieces as its tokens (less the end
    # token), until its text is all there; the next ones come in a chunk, the first unfinished streaming.
    (first,) = translator.translate([ENGLISH[0]], beams=1, max_new_tokens=12)
    assert len(first.token_ids) >= 6
    shown, count = "", 0
    while len(shown) < len(first.text):
        shown += pieces[count]
        count += 1
    assert shown == first.text and count >= len([t for t in first.token_ids if t != translator.manifest.tokens["eos"]])


def test_stream_refusals_are_ordinary_errors(server: Server) -> None:
    url = f"{server.url}/translate/stream"
    assert httpx.post(url, json={"q": "hi"}).status_code == 403
    assert httpx.post(url, json={"q": ["a", "b"], "api_key": KEY}).status_code == 400
    assert httpx.post(url, json={"q": "<b>a</b>", "format": "html", "api_key": KEY}).status_code == 400
    assert httpx.post(url, json={"q": "hi", "target": "xx", "api_key": KEY}).status_code == 400
    empty = httpx.post(url, json={"q": "", "api_key": KEY})
    assert empty.status_code == 200 and sse(empty) == [("done", {"translatedText": ""})]


# --- limits -------------------------------------------------------------------------------------------------------

PUBLIC_URL = "https://translate.example.com/mt"


def translated_texts(server: Server) -> float:
    """Texts the decoder has translated, over all models (/metrics)."""
    lines = httpx.get(f"{server.url}/metrics").text.splitlines()
    return sum(float(line.split()[-1]) for line in lines if line.startswith("onnxmt_translated_texts_total{"))


@pytest.fixture(scope="module")
def limited(tiny_onnx_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    """A server with small document limits, its public URL set, translated files kept 1 s, and a temporary
    folder of its own (to see what it leaves there)."""
    temporary = tmp_path_factory.mktemp("limited-tmp")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", str(temporary))
        running = start_server(
            tiny_onnx_dir,
            tmp_path_factory.mktemp("serve-limited"),
            max_document_cost=20000,
            max_chars=300,
            keep_files_seconds=1,
            public_url=PUBLIC_URL,
        )
    yield running, temporary
    assert running.stop() == 0, running.logs()


def test_a_document_over_its_cost_is_413_before_any_of_it_is_translated(limited: tuple[Server, Path]) -> None:
    server, _ = limited
    before = translated_texts(server)
    text = "\n".join(ENGLISH * 20).encode()
    response = httpx.post(
        f"{server.url}/translate_file", files={"file": ("a.txt", text)}, data={"max_new_tokens": "6"}, timeout=60
    )
    assert response.status_code == 413, response.text
    assert "tokens x beams; the limit is 20000 (max_document_cost)" in response.json()["error"]
    page = "<p>Hello there. <b>How</b> are you?</p>"
    html = {"q": [page] * 40, "format": "html", "max_new_tokens": 60, "beams": 8}  # 80 sentences x (tokens + 59) x 8
    pages = httpx.post(f"{server.url}/translate", json=html, timeout=60)
    assert pages.status_code == 413 and "(max_document_cost)" in pages.json()["error"], pages.text
    assert translated_texts(server) == before


def test_a_documents_sentences_are_held_to_max_chars(limited: tuple[Server, Path]) -> None:
    server, _ = limited
    long_sentence = ("word " * 100).strip() + "."  # 500 characters: one sentence over max_chars (300)
    for name, data in (("a.txt", long_sentence), ("a.srt", f"1\n00:00:01,000 --> 00:00:02,000\n{long_sentence}\n")):
        response = httpx.post(f"{server.url}/translate_file", files={"file": (name, data.encode())}, timeout=60)
        assert response.status_code == 413 and "(max_chars)" in response.json()["error"], response.text


def test_translated_files_are_at_the_public_url_expire_on_a_timer_and_go_at_exit(
    limited: tuple[Server, Path], server: Server
) -> None:
    running, temporary = limited
    body = {"files": {"file": ("notes.txt", TEXT.encode())}, "data": {"max_new_tokens": "4"}, "timeout": 60}
    response = httpx.post(f"{running.url}/translate_file", **body)  # type: ignore[arg-type]
    assert response.status_code == 200, response.text
    url = response.json()["translatedFileUrl"]
    assert url.startswith(f"{PUBLIC_URL}/download_file/") and url.endswith(".notes.txt")
    local = running.url + url.removeprefix(PUBLIC_URL)
    assert httpx.get(local).status_code == 200
    stored = [p for d in temporary.glob("onnxmt-translated-*") for p in d.iterdir()]
    assert len(stored) == 1
    time.sleep(2.0)  # kept 1 s; no other upload comes
    assert httpx.get(local).status_code == 404 and not stored[0].exists()
    # Forwarded headers are not trusted unless --forwarded-allow-ips says so: the URL keeps the request's scheme.
    forwarded = upload(server, "notes.txt", TEXT.encode(), max_new_tokens="4")
    headers = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.9"}
    forged = httpx.post(
        f"{server.url}/translate_file",
        files={"file": ("a.txt", b"Hello.")},
        data={"api_key": KEY, "max_new_tokens": "4"},
        headers=headers,
        timeout=60,
    )
    assert forwarded.json()["translatedFileUrl"].startswith(f"{server.url}/download_file/")
    assert forged.json()["translatedFileUrl"].startswith(f"{server.url}/download_file/")


def test_the_store_folder_is_removed_at_exit(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", str(tmp_path))
        running = start_server(tiny_onnx_dir, tmp_path)
    response = httpx.post(f"{running.url}/translate_file", files={"file": ("a.txt", b"Hello there.")}, timeout=60)
    assert response.status_code == 200 and len(list(tmp_path.glob("onnxmt-translated-*"))) == 1
    assert running.stop() == 0, running.logs()
    assert not list(tmp_path.glob("onnxmt-translated-*"))


def test_a_client_that_leaves_cancels_its_files_work(server: Server) -> None:
    """A file of 1,500 sentences (about a minute of decoding here at 8 beams): the client gives up after 2 s; the
    server stops translating it within a few seconds, far from its end."""
    text = "\n".join(f"Hello number {i}." for i in range(1500)).encode()
    before = translated_texts(server)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{server.url}/translate_file",
            files={"file": ("big.txt", text)},
            data={"api_key": KEY, "max_new_tokens": "60", "beams": "8"},
            timeout=2,
        )
    time.sleep(3.0)
    stopped = translated_texts(server)
    time.sleep(2.0)
    assert translated_texts(server) == stopped, "the file was still being translated after its client left"
    assert 0 < stopped - before < 1000  # it had started, and was far from done


def test_sigterm_while_documents_are_prepared_and_translated_answers_them_and_exits_in_time(
    tiny_onnx_dir: Path, tmp_path: Path
) -> None:
    """SIGTERM with documents in every state (waiting for the one worker, prepared, being translated): each
    client gets an answer (503 for work the drain cut short), and the process is gone within --timeout + 5 s."""
    timeout = 3.0
    running = start_server(tiny_onnx_dir, tmp_path, timeout=timeout, document_workers=1)
    big = "\n".join(f"Hello number {i}." for i in range(1500)).encode()
    page = ("<p>" + "<b>Hello</b> there, my friend. " * 3 + "</p>\n") * 2000  # a long preparation, then work

    async def send_and_stop() -> tuple[list[httpx.Response | BaseException], float]:
        async with httpx.AsyncClient(base_url=running.url, timeout=60) as client:
            data = {"max_new_tokens": "60", "beams": "8"}
            tasks = [
                asyncio.create_task(client.post("/translate_file", files={"file": (name, body)}, data=data))
                for name, body in (("a.txt", big), ("b.html", page.encode()), ("c.txt", big), ("d.html", page.encode()))
            ]
            await asyncio.sleep(1.5)
            running.process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            return await asyncio.gather(*tasks, return_exceptions=True), signalled

    answers, signalled = asyncio.run(send_and_stop())
    assert running.process.wait(timeout=30) == 0, running.logs()
    assert time.monotonic() - signalled < timeout + 5 + 2, running.logs()
    for answer in answers:
        assert isinstance(answer, httpx.Response), (answer, running.logs())
        assert answer.status_code in (200, 503), answer.text
    assert any(a.status_code == 503 for a in answers if isinstance(a, httpx.Response)), "the drain cut nothing short"


def test_streams_and_html_snippets_do_not_wait_for_a_document_worker(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    """One document worker and a queue of 2: 24 one-sentence streams (what the page at / sends) and 24 HTML
    snippets at once are all answered, as 24 plain /translate requests are: a request's own texts are prepared on a
    thread, not queued for a worker. A file still goes to the worker."""
    server = start_server(
        tiny_onnx_dir, tmp_path, document_workers=1, max_document_queue=2, max_new_tokens=4, max_request_cost=0
    )

    async def run() -> tuple[list[int], list[int]]:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            streams = [client.post("/translate/stream", json={"q": f"{s} {i}", "source": "en"}) for i, s in
                       enumerate(ENGLISH[:12] * 2)]  # fmt: skip
            pages = [
                client.post("/translate", json={"q": f"<p>{s} <b>{i}</b></p>", "source": "en", "format": "html"})
                for i, s in enumerate(ENGLISH[:12] * 2)
            ]
            answers = await asyncio.gather(*streams, *pages)
            return [r.status_code for r in answers[:24]], [r.status_code for r in answers[24:]]

    try:
        streams, pages = asyncio.run(run())
        file = httpx.post(
            f"{server.url}/translate_file",
            data={"source": "en", "target": "zh"},
            files={"file": ("a.txt", TEXT.encode(), "text/plain")},
            timeout=60,
        )
    finally:
        assert server.stop() == 0, server.logs()
    assert streams == [200] * 24 and pages == [200] * 24
    assert file.status_code == 200, file.text
