"""Every size limit of the service on both sides of its boundary: exactly at the limit accepted, one over refused.

Bodies (Content-Length and chunked), texts and characters per request, beams, request and document costs, the
sizes of a document (texts, sentences, a sentence's characters, tokens; a .docx's unpacked bytes, zip ratio and XML
nodes), the queue, the limits per API key (the server's and a key's own from `onnxmt keys`), and what the service
keeps (translated files, the translation cache). The sizes at the
boundary are counted here without the code under test (the bytes sent, the texts written, the tokenizer, expat for
XML nodes, zipfile for a .docx's members), mostly on the limit functions themselves, plus the HTTP paths that carry
them."""

from __future__ import annotations

import asyncio
import io
import json
import threading
import time
import xml.parsers.expat
import zipfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from onnxmt import Translator
from onnxmt.cli import app as cli
from onnxmt.documents.limits import DEFAULT_LIMITS, DocumentLimits, DocumentTooLarge
from onnxmt.documents.translate import counting, plan_texts
from onnxmt.runtime.options import BatchLimits
from onnxmt.serve.apis import texts_of
from onnxmt.serve.app import create_app
from onnxmt.serve.batcher import MicroBatcher, QueueFull
from onnxmt.serve.guards import BodyLimitMiddleware, BodyTooLarge
from onnxmt.serve.limits import KeyLimits, KeyStore, LimitExceeded, Quota
from onnxmt.serve.options import ServeOptions
from onnxmt.serve.protocol import ApiError, parse_detect, parse_translate
from tests.helpers.server import Server, server_fixture
from tests.helpers.skips import importorskip

# --- bodies -------------------------------------------------------------------------------------------------------


def _through(limit: int, chunks: list[bytes], content_length: int | None) -> tuple[int | None, bytes]:
    """`chunks` sent through BodyLimitMiddleware(limit) to an app that reads the whole body: (the status the
    middleware answered itself, or None; the body the app read). BodyTooLarge propagates, as to the app's handler."""
    read = bytearray()
    answered: list[int] = []

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            read.extend(message.get("body", b""))
            if not message.get("more_body"):
                return

    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    headers = [] if content_length is None else [(b"content-length", str(content_length).encode())]
    scope = {"type": "http", "path": "/translate", "headers": headers}

    async def receive() -> Any:
        return messages.pop(0)

    async def send(message: Any) -> None:
        if message["type"] == "http.response.start":
            answered.append(message["status"])

    asyncio.run(BodyLimitMiddleware(inner, limit)(scope, receive, send))
    return (answered[0] if answered else None), bytes(read)


@pytest.mark.parametrize("limit", [1, 1000, 65536])
def test_a_body_of_the_limit_passes_and_one_byte_more_is_413(limit: int) -> None:
    body = b"x" * limit
    assert _through(limit, [body], limit) == (None, body)
    assert _through(limit, [body + b"x"], limit + 1)[0] == 413
    # Chunked: no Content-Length, the bytes counted as they come, in pieces of any size.
    pieces = [body[i : i + 7] for i in range(0, limit, 7)]
    assert _through(limit, pieces, None) == (None, body)
    with pytest.raises(BodyTooLarge, match=f"{limit + 1} bytes or more, the limit is {limit}"):
        _through(limit, [*pieces, b"x"], None)


LIMITS = {"max_body_bytes": 4096, "max_chars": 50, "max_texts": 4, "max_beams": 3}
server = server_fixture("tiny_onnx_dir", log="boundaries", **LIMITS)


def _padded(size: int) -> bytes:
    """A valid /translate body of exactly `size` bytes (JSON allows blanks after the object)."""
    body = json.dumps({"q": "Hello", "max_new_tokens": 3}).encode()
    return body + b" " * (size - len(body))


def test_bodies_at_the_limit_are_translated_over_it_413_with_and_without_content_length(server: Server) -> None:
    limit = LIMITS["max_body_bytes"]
    headers = {"Content-Type": "application/json"}

    def chunked(data: bytes) -> Iterator[bytes]:  # httpx sends an iterator without Content-Length, chunked
        yield from (data[i : i + 1000] for i in range(0, len(data), 1000))

    for size, status in ((limit, 200), (limit + 1, 413)):
        body = _padded(size)
        assert len(body) == size
        sized = httpx.post(f"{server.url}/translate", content=body, headers=headers, timeout=60)
        assert sized.status_code == status, (size, sized.text)
        streamed = httpx.post(f"{server.url}/translate", content=chunked(body), headers=headers, timeout=60)
        assert streamed.status_code == status, (size, streamed.text)
        assert "content-length" not in streamed.request.headers


# --- texts, characters, beams ----------------------------------------------------------------------------------


@pytest.mark.parametrize("limit", [1, 4, 64])
def test_texts_per_request(limit: int) -> None:
    options = ServeOptions(max_texts=limit)
    assert len(parse_translate({"q": ["a"] * limit}, options, form=False).texts) == limit
    with pytest.raises(ApiError, match=f"{limit + 1} texts exceed the limit of {limit}"):
        parse_translate({"q": ["a"] * (limit + 1)}, options, form=False)


@pytest.mark.parametrize("limit", [1, 50, 5000])
def test_characters_per_text(limit: int) -> None:
    options = ServeOptions(max_chars=limit)
    text = "é" * limit  # characters, not bytes
    assert parse_translate({"q": [text, "b"]}, options, form=False).texts[0] == text
    assert parse_detect({"q": text}, options) == text
    for call in (
        lambda: parse_translate({"q": ["b", text + "a"]}, options, form=False),
        lambda: parse_detect({"q": text + "a"}, options),
    ):
        with pytest.raises(ApiError, match=f"has {limit + 1} characters, the limit is {limit}"):
            call()


def test_the_other_apis_texts_and_characters() -> None:
    """DeepL's and Google's requests (serve/apis.py texts_of) are held to the same two limits."""

    class Held:
        options = ServeOptions(max_texts=3, max_chars=10)

    held: Any = Held()
    assert texts_of(["a" * 10] * 3, "text", held) == ["a" * 10] * 3
    with pytest.raises(ApiError, match="4 exceed the limit of 3"):
        texts_of(["a"] * 4, "text", held)
    with pytest.raises(ApiError, match="text\\[1\\] has 11 characters, the limit is 10"):
        texts_of(["a", "a" * 11], "text", held)


@pytest.mark.parametrize("limit", [1, 3, 8])
def test_beams_and_alternatives(limit: int) -> None:
    options = ServeOptions(max_beams=limit)
    assert parse_translate({"q": "a", "beams": limit}, options, form=False).beams == limit
    assert parse_translate({"q": "a", "alternatives": limit - 1}, options, form=False).alternatives == limit - 1
    with pytest.raises(ApiError, match=f"beams {limit + 1} exceeds the limit of {limit}"):
        parse_translate({"q": "a", "beams": limit + 1}, options, form=False)
    with pytest.raises(ApiError, match=f"alternatives {limit} needs more beams"):
        parse_translate({"q": "a", "alternatives": limit}, options, form=False)


def test_texts_characters_and_beams_over_http(server: Server) -> None:
    def post(path: str, body: dict[str, Any]) -> int:
        return httpx.post(f"{server.url}{path}", json={"max_new_tokens": 3, **body}, timeout=60).status_code

    texts, chars, beams = LIMITS["max_texts"], LIMITS["max_chars"], LIMITS["max_beams"]
    assert post("/translate", {"q": ["a"] * texts}) == 200
    assert post("/translate", {"q": ["a"] * (texts + 1)}) == 400
    assert post("/translate", {"q": "a" * chars}) == 200
    assert post("/translate", {"q": "a" * (chars + 1)}) == 400
    assert post("/translate", {"q": "a", "beams": beams}) == 200
    assert post("/translate", {"q": "a", "beams": beams + 1}) == 400
    assert post("/v2/translate", {"text": ["a" * chars] * texts, "target_lang": "ZH"}) == 200
    assert post("/v2/translate", {"text": ["a"] * (texts + 1), "target_lang": "ZH"}) == 400
    assert post("/detect", {"q": "a" * chars}) == 200
    assert post("/detect", {"q": "a" * (chars + 1)}) == 400


# --- costs ----------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def translator(tiny_onnx_dir: Path) -> Translator:
    return Translator(tiny_onnx_dir)


@pytest.fixture(scope="module")
def client(tiny_onnx_dir: Path) -> Iterator[TestClient]:
    """The service in this process, so that a test can set a limit the service reads per request (costs)."""
    with TestClient(create_app(tiny_onnx_dir, ServeOptions(cache_size=0))) as client:
        deadline = time.monotonic() + 60
        while client.get("/ready").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        yield client


def _limited(client: TestClient, **limits: Any) -> None:
    service = client.app.state.service  # type: ignore[attr-defined]
    service.options = replace(service.options, **limits)
    service.limits = service.options.document_limits()


def _cost(translator: Translator, sentences: list[str], beams: int, max_new_tokens: int) -> int:
    """Tokens x beams as the docs define them: (source tokens + max new tokens) x beams, summed over the texts."""
    return sum((len(translator.tokenizer.encode(s)) + max_new_tokens) * beams for s in sentences)


def test_request_cost(client: TestClient, translator: Translator) -> None:
    body = {"q": ["Hello world.", "The river is long."], "beams": 2, "max_new_tokens": 7}
    cost = _cost(translator, body["q"], 2, 7)  # type: ignore[arg-type]
    try:
        _limited(client, max_request_cost=cost)
        assert client.post("/translate", json=body).status_code == 200
        _limited(client, max_request_cost=cost - 1)
        refused = client.post("/translate", json=body)
        assert refused.status_code == 413 and f"costs {cost} tokens x beams" in refused.json()["error"]
    finally:
        _limited(client, max_request_cost=ServeOptions().max_request_cost)


def test_document_cost(client: TestClient, translator: Translator) -> None:
    sentences = ["Hello world.", "The river is long.", "Good night."]
    page = "<p>" + " ".join(sentences) + "</p>"
    body = {"q": page, "format": "html", "beams": 2, "max_new_tokens": 5}
    cost = _cost(translator, sentences, 2, 5)
    try:
        _limited(client, max_document_cost=cost)
        assert client.post("/translate", json=body).status_code == 200
        _limited(client, max_document_cost=cost - 1)
        refused = client.post("/translate", json=body)
        assert refused.status_code == 413, refused.text
        assert f"cost {cost} tokens x beams; the limit is {cost - 1}" in refused.json()["error"]
    finally:
        _limited(client, max_document_cost=ServeOptions().max_document_cost)


# --- a document's sizes -----------------------------------------------------------------------------------------


def _plan(translator: Translator, texts: list[str], **limits: int) -> list[str]:
    return plan_texts(texts, counting(translator), DocumentLimits(**limits), tokenizer=translator.tokenizer).sentences


def test_document_texts_sentences_and_sentence_characters(translator: Translator) -> None:
    texts = ["One here. Two here. Three here.", "Four here."]
    assert len(_plan(translator, texts, max_texts=2, max_sentences=4)) == 4
    with pytest.raises(DocumentTooLarge, match=r"3 blocks of text .* limit is 2 \(max_document_texts\)"):
        _plan(translator, [*texts, "Five."], max_texts=2)
    with pytest.raises(DocumentTooLarge, match=r"4 sentences; the limit is 3 \(max_document_sentences\)"):
        _plan(translator, texts, max_sentences=3)
    assert _plan(translator, ["a" * 30 + ". Short one."], max_sentence_chars=31) == ["a" * 30 + ".", "Short one."]
    with pytest.raises(DocumentTooLarge, match=r"sentence 1 .* has 31 characters; the limit is 30 \(max_chars\)"):
        _plan(translator, ["a" * 30 + ". Short one."], max_sentence_chars=30)


def test_document_tokens(translator: Translator) -> None:
    texts = ["Hello world. The river is long.", "Good night."]
    tokens = sum(len(translator.tokenizer.encode(s)) for s in ["Hello world.", "The river is long.", "Good night."])
    assert len(_plan(translator, texts, max_tokens=tokens)) == 3
    with pytest.raises(DocumentTooLarge, match=r"\(max_document_cost\)"):
        _plan(translator, texts, max_tokens=tokens - 1)


def _xml_nodes(data: bytes) -> int:
    """What the .docx limit counts, counted with expat: elements, attributes, namespace declarations, comments and
    processing instructions of its XML parts."""
    count = 0

    def one(*_: object) -> None:
        nonlocal count
        count += 1

    def element(_: str, attributes: dict[str, str]) -> None:
        nonlocal count
        count += 1 + len(attributes)

    with zipfile.ZipFile(io.BytesIO(data)) as package:
        for name in package.namelist():
            if name.lower().endswith((".xml", ".rels")):
                parser = xml.parsers.expat.ParserCreate(namespace_separator=" ")
                parser.StartElementHandler = element
                parser.StartNamespaceDeclHandler = parser.CommentHandler = parser.ProcessingInstructionHandler = one
                parser.Parse(package.read(name), True)
    return count


def test_docx_unpacked_bytes_ratio_and_xml_nodes() -> None:
    importorskip("docx")
    from onnxmt.documents.office import prepare_docx
    from tests.helpers.office import MIB, base_docx, deflated, with_members

    data = with_members(deflated("word/media/zeros.bin", bytes(MIB)))  # a member the ratio is checked on
    with zipfile.ZipFile(io.BytesIO(data)) as package:
        members = [i for i in package.infolist() if not i.is_dir()]
    unpacked = sum(i.file_size for i in members)
    ratio = max(i.file_size / i.compress_size for i in members)
    nodes = _xml_nodes(data)
    exact = DocumentLimits(max_unpacked_bytes=unpacked, max_ratio=ratio, max_xml_elements=nodes, max_texts=3)
    texts, _ = prepare_docx(data, exact)
    assert texts == ["A title for the document", "This is bold and this is italic", "A cell"]
    for over, match in [
        ({"max_unpacked_bytes": unpacked - 1}, f"unpacks to {unpacked} bytes"),
        ({"max_ratio": ratio * (1 - 1e-9)}, "(max_document_ratio)"),
        ({"max_xml_elements": nodes - 1}, "(max_document_xml_elements)"),
        ({"max_texts": 2}, "3 blocks of text"),
    ]:
        with pytest.raises(DocumentTooLarge, match=match.replace("(", r"\(").replace(")", r"\)")):
            prepare_docx(data, replace(exact, **over))
    assert base_docx()  # the document the members come from


def test_the_services_document_limits_default_to_the_librarys() -> None:
    """A document's bounds that the library has too are the service's defaults; a sentence's characters and the
    tokens are the service's own settings (max_chars, max_document_cost)."""
    options = ServeOptions()
    expected = replace(DEFAULT_LIMITS, max_sentence_chars=options.max_chars, max_tokens=options.max_document_cost)
    assert options.document_limits() == expected
    assert ServeOptions(max_document_texts=7, max_document_unpacked_mb=0.5).document_limits() == replace(
        expected, max_texts=7, max_unpacked_bytes=2**19
    )


# --- the queue ------------------------------------------------------------------------------------------------------


def test_the_queue_holds_max_queue_requests_and_refuses_the_next() -> None:
    from tests.serve.test_batcher import _echo, _gated, _prepared

    gate = threading.Event()

    async def main() -> None:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(1) as executor:
            batcher = MicroBatcher(_gated(gate), executor, limits=BatchLimits(1), window=0, max_queue=3)
            batcher.start()
            try:
                running = asyncio.create_task(batcher.translate(_prepared(["run"]), None))
                await asyncio.sleep(0.1)  # taken by the inference thread: no longer waiting
                waiting = [asyncio.create_task(batcher.translate(_prepared([t]), None)) for t in "abc"]
                await asyncio.sleep(0.01)
                assert batcher.depth == 3
                with pytest.raises(QueueFull, match="3 requests waiting"):  # at once, not queued
                    await asyncio.wait_for(batcher.translate(_prepared(["d"]), None), 5)
                gate.set()
                assert [await w for w in (running, *waiting)] == [_echo(_prepared([t])) for t in ("run", *"abc")]
            finally:
                gate.set()
                await batcher.stop()

    asyncio.run(main())


# --- per API key --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("limit", [1, 3])
def test_requests_per_window(limit: int) -> None:
    store = KeyStore(None)
    for _ in range(limit):
        store.charge("key:a", 1, KeyLimits(req_limit=limit), 60, now=60.0)
    with pytest.raises(LimitExceeded, match=f"the limit is {limit} per 60 seconds"):
        store.charge("key:a", 1, KeyLimits(req_limit=limit), 60, now=119.9)


@pytest.mark.parametrize("limit", [1, 100])
def test_characters_per_request_and_per_day(limit: int) -> None:
    store = KeyStore(None)
    store.charge("key:a", limit, KeyLimits(char_limit=limit), 60, now=0.0)
    with pytest.raises(ApiError, match=f"{limit + 1} characters, the limit is {limit} per request"):
        store.charge("key:a", limit + 1, KeyLimits(char_limit=limit), 60, now=0.0)
    daily = KeyLimits(daily_char_limit=limit)
    store.charge("key:b", limit, daily, 60, now=0.0)  # the whole day's at once
    with pytest.raises(LimitExceeded, match=f"{limit} of {limit} are used, this request has 1"):
        store.charge("key:b", 1, daily, 60, now=1.0)


def test_a_keys_own_limits_from_onnxmt_keys_override_the_servers(tmp_path: Path) -> None:
    """`onnxmt keys add` with limits of its own: each bound at its value, on both sides, where the server's are
    other values; a key without its own has the server's; 0 is none."""
    db = tmp_path / "keys.db"

    def add(*flags: str) -> str:
        result = CliRunner().invoke(cli, ["keys", "add", "--key-db", str(db), *flags])
        assert result.exit_code == 0, result.output
        return result.stdout.strip()

    own = add("--req-limit", "2", "--char-limit", "30", "--daily-char-limit", "50")
    plain = add()
    unlimited = add("--req-limit", "0", "--char-limit", "0")
    window = 1e9  # one window for the whole test
    quota = Quota(ServeOptions(key_db=str(db), req_limit=5, char_limit=10, daily_char_limit=1000, limit_window=window))

    async def charge(key: str, chars: int) -> None:
        await quota.charge(key, "127.0.0.1", chars)

    async def main() -> None:
        await charge(own, 30)  # its own char limit, above the server's 10
        with pytest.raises(ApiError, match="31 characters, the limit is 30"):
            await charge(own, 31)
        await charge(own, 20)  # the second request: its own request limit; 50 characters: its own day
        with pytest.raises(LimitExceeded, match="the limit is 2 per"):
            await charge(own, 1)
        await charge(plain, 10)
        with pytest.raises(ApiError, match="11 characters, the limit is 10"):
            await charge(plain, 11)
        for _ in range(4):
            await charge(plain, 1)  # 5 requests: the server's limit
        with pytest.raises(LimitExceeded, match="the limit is 5 per"):
            await charge(plain, 1)
        for _ in range(8):
            await charge(unlimited, 100)  # no request or character limit of its own; the server's day is 1000
        with pytest.raises(LimitExceeded, match="800 of 1000 are used, this request has 201"):
            await charge(unlimited, 201)
        await charge(unlimited, 200)

    try:
        asyncio.run(main())
    finally:
        quota.close()
    own_day = KeyStore(db)
    try:
        assert own_day.used_today(f"key:{own}") == 50
        with pytest.raises(LimitExceeded, match="50 of 50 are used"):
            own_day.charge(f"key:{own}", 1, KeyLimits(daily_char_limit=50), window)
    finally:
        own_day.close()


# --- what the service keeps -----------------------------------------------------------------------------------------


def test_translated_files_up_to_max_stored_bytes(tmp_path: Path) -> None:
    from onnxmt.serve.downloads import Downloads, TooLargeToStore

    store = Downloads(max_bytes=1000, keep_seconds=3600)
    try:
        first = store.store("a.txt", b"a" * 400)
        second = store.store("b.txt", b"b" * 600)  # 1000 bytes together: both kept
        assert store.path(first) is not None and store.path(second) is not None
        third = store.store("c.txt", b"c")  # one byte over: the oldest goes
        assert store.path(first) is None and store.path(second) is not None and store.path(third) is not None
        store.store("d.txt", b"d" * 1000)  # the whole store
        with pytest.raises(TooLargeToStore, match="1001 bytes"):
            store.store("e.txt", b"e" * 1001)
    finally:
        store.close()


def test_the_translation_cache_by_entries_and_bytes() -> None:
    from onnxmt.runtime.translator import Translation
    from onnxmt.serve.cache import TranslationCache, entry_bytes
    from tests.serve.test_batcher import _prepared

    keys = [("model", p) for p in _prepared(["one", "two", "three"])]
    translations = [Translation(text.upper(), [1, 2], 0.0) for text in ("one", "two", "three")]
    sizes = [entry_bytes(k, t) for k, t in zip(keys, translations, strict=True)]

    def kept(cache: TranslationCache) -> list[bool]:
        for key, translation in zip(keys, translations, strict=True):
            cache.put(key, translation)
        return [cache.get(key) is not None for key in keys]

    assert kept(TranslationCache(3)) == [True, True, True]
    assert kept(TranslationCache(2)) == [False, True, True]
    assert kept(TranslationCache(10, sum(sizes))) == [True, True, True]
    assert kept(TranslationCache(10, sum(sizes) - 1)) == [False, True, True]
