"""A request is prepared once (`Translator.prepare`): no text is tokenized twice for one answer, in the library,
the document functions and the service's /translate (cache hits and misses), html, files and streams."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from onnxmt import DecodeOptions, Translator
from onnxmt.documents import translate_document, translate_stream
from onnxmt.serve.app import create_app
from onnxmt.serve.options import ServeOptions
from onnxmt.testing import generate_corpus
from onnxmt.tokenization import MarianTokenizer

ENGLISH = generate_corpus(23, lines=24)[0]
DOCUMENT = "\n\n".join(" ".join(ENGLISH[i : i + 3]) for i in range(0, 12, 3)) + "\n"
SHORT = {"max_new_tokens": 4}


@pytest.fixture
def encoded(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Every text the run side's Marian tokenizer encodes, in this process, counted."""
    seen: Counter[str] = Counter()
    encode = MarianTokenizer.encode

    def counted(self: MarianTokenizer, text: str, *args: object, **kwargs: object) -> list[int]:
        seen[text] += 1
        return encode(self, text, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(MarianTokenizer, "encode", counted)
    return seen


@pytest.fixture(scope="module")
def translator(tiny_onnx_dir: Path) -> Translator:
    return Translator(tiny_onnx_dir, decoding=DecodeOptions(**SHORT))


def test_translate_and_cost_tokenize_each_text_once(translator: Translator, encoded: Counter[str]) -> None:
    texts = [*ENGLISH[:5], "", "  "]
    translator.translate(texts)
    assert sorted(encoded) == sorted(ENGLISH[:5]) and set(encoded.values()) == {1}  # blank texts: never
    encoded.clear()
    prepared = translator.prepare(texts)
    assert sum(p.cost for p in prepared) == translator.cost(texts)
    translator.translate_prepared(prepared)
    assert set(encoded.values()) == {2}  # once by prepare, once by cost: translate_prepared tokenizes nothing


def test_documents_and_streams_tokenize_each_sentence_once(translator: Translator, encoded: Counter[str]) -> None:
    translated = translate_document(translator, DOCUMENT)
    assert len(encoded) >= 8 and max(encoded.values()) == 1, encoded.most_common(3)
    encoded.clear()
    assert "".join(translate_stream(translator, DOCUMENT, beams=1)) == translate_document(translator, DOCUMENT, beams=1)
    assert max(encoded.values()) == 2  # the stream's once, and the comparison's once
    assert translated


@pytest.fixture(scope="module")
def clients(tiny_onnx_dir: Path) -> Iterator[dict[str, TestClient]]:
    """The service without and with its translation cache."""
    apps = {
        "uncached": create_app(tiny_onnx_dir, ServeOptions(cache_size=0)),
        "cached": create_app(tiny_onnx_dir, ServeOptions(cache_size=1000)),
    }
    with TestClient(apps["uncached"]) as uncached, TestClient(apps["cached"]) as cached:
        for client in (uncached, cached):
            deadline = time.monotonic() + 60
            while client.get("/ready").status_code != 200 and time.monotonic() < deadline:
                time.sleep(0.05)
        yield {"uncached": uncached, "cached": cached}


@pytest.mark.parametrize("name", ["uncached", "cached"])
def test_translate_tokenizes_each_text_once_per_answer(
    clients: dict[str, TestClient], name: str, encoded: Counter[str]
) -> None:
    texts = ENGLISH[5:11]
    body = {"q": [*texts, texts[0]], "source": "en", "target": "zh", **SHORT}
    for _ in range(2):  # the second time, a cached service answers from its cache: tokenized, never decoded
        encoded.clear()
        answer = clients[name].post("/translate", json=body)
        assert answer.status_code == 200, answer.text
        assert sorted(encoded) == sorted(texts) and set(encoded.values()) == {1}, encoded
    # source "auto": detected once for the request, tokenized once all the same.
    encoded.clear()
    assert clients[name].post("/translate", json={**body, "source": "auto"}).status_code == 200
    assert set(encoded.values()) == {1}


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.post(
            "/translate", json={"q": "<p>" + DOCUMENT + "</p>", "format": "html", "target": "zh", **SHORT}
        ),
        lambda c: c.post("/translate/stream", json={"q": DOCUMENT, "source": "en", "target": "zh", **SHORT}),
        lambda c: c.post("/translate_file", files={"file": ("a.txt", DOCUMENT.encode())}, data={"target": "zh"}),
    ],
    ids=["html", "stream", "file"],
)
def test_documents_are_tokenized_once_where_they_are_cut(
    clients: dict[str, TestClient], call: object, encoded: Counter[str]
) -> None:
    """A document is cut into sentences, each sentence's tokens counted there (a file in a worker process; a
    request's own texts, HTML snippets and streams, on a thread of this process): the service translates them by
    those ids and tokenizes none of them again."""
    answer = call(clients["uncached"])  # type: ignore[operator]
    assert answer.status_code == 200, answer.text
    assert set(encoded.values()) <= {1}, encoded  # at most once: where it was cut, if that was in this process
