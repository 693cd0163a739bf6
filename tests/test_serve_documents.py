"""serve/documents.py over HTTP: `format: "html"`, /translate_file and /download_file, /translate/stream."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from onnxmt import DecodeOptions, Translator
from onnxmt.documents import translate_document, translate_file, translate_string
from onnxmt.documents.html import parse
from onnxmt.documents.subtitles import cues
from onnxmt.export.random_model import generate_corpus
from test_serve import Server, start_server

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


@pytest.fixture(scope="module")
def server(tiny_onnx_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = start_server(
        tiny_onnx_dir, tmp_path_factory.mktemp("serve-documents"), api_keys=KEY, max_body_bytes=65536
    )
    yield running
    assert running.stop() == 0, running.logs()


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
    pytest.importorskip("docx")
    from test_documents import docx_structure, make_docx

    make_docx(tmp_path / "in.docx")
    response = upload(server, "report.docx", (tmp_path / "in.docx").read_bytes())
    (tmp_path / "out.docx").write_bytes(download(response))
    assert docx_structure(tmp_path / "out.docx") == docx_structure(tmp_path / "in.docx")
    assert response.json()["translatedFileUrl"].endswith(".report.docx")


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


def test_stream_refusals_are_ordinary_errors(server: Server) -> None:
    url = f"{server.url}/translate/stream"
    assert httpx.post(url, json={"q": "hi"}).status_code == 403
    assert httpx.post(url, json={"q": ["a", "b"], "api_key": KEY}).status_code == 400
    assert httpx.post(url, json={"q": "<b>a</b>", "format": "html", "api_key": KEY}).status_code == 400
    assert httpx.post(url, json={"q": "hi", "target": "xx", "api_key": KEY}).status_code == 400
    empty = httpx.post(url, json={"q": "", "api_key": KEY})
    assert empty.status_code == 200 and sse(empty) == [("done", {"translatedText": ""})]
