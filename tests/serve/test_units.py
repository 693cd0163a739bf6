"""/translate cuts each text into the unit of text of the model that reads it (serve/units.py): a Mastodon post of
five sentences reaches a sentence-level model (the tiny Marian) as five texts and a decoder-only translator (the tiny
HY-MT) as one; --text-unit overrides it; a text's alternatives are its sentences' alternatives joined."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from onnxmt import DecodeOptions, Translator
from onnxmt.architectures import PARAGRAPH, text_unit
from onnxmt.documents.segment import join, split_sentences
from onnxmt.serve.options import ServeOptions
from tests.helpers.server import metric_sample

SENTENCES = [
    "Just moved to this instance!",
    "The weather here is lovely today.",
    "I will post photos of the river soon.",
    "Does anyone know a good bakery nearby?",
    "See you all around.",
]
POST = " ".join(SENTENCES)
SHORT = DecodeOptions(max_new_tokens=6)


@contextmanager
def _client(model_dir: Path, **options: Any) -> Iterator[Any]:
    from fastapi.testclient import TestClient

    from onnxmt.serve.app import create_app

    with TestClient(create_app(model_dir, ServeOptions(**options), decoding=SHORT)) as client:
        deadline = time.monotonic() + 30
        while client.get("/ready").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        yield client


def _decoded(client: Any) -> float:
    return metric_sample(client.get("/metrics").text, "onnxmt_translated_texts_total", model="model")


def test_a_post_reaches_a_sentence_level_model_as_its_sentences(tiny_onnx_dir: Path) -> None:
    pieces = split_sentences(POST)
    assert [p.text for p in pieces if p.translate] == SENTENCES  # the segmenter finds the five sentences
    translator = Translator(tiny_onnx_dir, decoding=SHORT)
    sentences = [t.text for t in translator.translate(SENTENCES)]
    with _client(tiny_onnx_dir) as client:
        answer = client.post("/translate", json={"q": POST, "source": "en", "target": "zh"})
        assert answer.status_code == 200, answer.text
        assert _decoded(client) == 5
        assert answer.json()["translatedText"] == join(pieces, sentences)
        # One sentence alone: the text as it came, one text for the model.
        spaced = f"  {SENTENCES[2]}  "
        both = client.post("/translate", json={"q": [spaced, POST]}).json()["translatedText"]
        assert both == [translator.translate([spaced])[0].text, join(pieces, sentences)]
        assert _decoded(client) == 6  # the post's sentences from the cache


def test_alternatives_of_a_cut_text_join_its_sentences_alternatives(tiny_onnx_dir: Path) -> None:
    """(And a glossary is refused by a model without a terminology prompt.)"""
    translator = Translator(tiny_onnx_dir, decoding=SHORT)
    two = SENTENCES[:2]
    found = translator.translate(two, beams=2, num_return_sequences=2)
    with _client(tiny_onnx_dir, cache_size=0) as client:
        answer = client.post("/translate", json={"q": " ".join(two), "alternatives": 1, "beams": 2}).json()
        refused = client.post("/translate", json={"q": "Hi", "glossary": {"Hi": "你好"}})
    assert refused.status_code == 400 and "no such template" in refused.json()["error"]
    pieces = split_sentences(" ".join(two))
    assert answer["translatedText"] == join(pieces, [t.text for t in found])
    assert answer["alternatives"] == [join(pieces, [t.alternatives[0].text for t in found])]


def test_text_unit_overrides_the_family(tiny_onnx_dir: Path) -> None:
    translator = Translator(tiny_onnx_dir, decoding=SHORT)
    with _client(tiny_onnx_dir, text_unit="paragraph") as client:
        answer = client.post("/translate", json={"q": f"{POST}\n{SENTENCES[0]}"})
        assert _decoded(client) == 2  # each line whole
    lines = [t.text for t in translator.translate([POST, SENTENCES[0]])]
    assert answer.json()["translatedText"] == "\n".join(lines)


def test_a_post_reaches_a_decoder_only_model_whole(hy_mt_onnx_dir: Path) -> None:
    translator = Translator(hy_mt_onnx_dir, decoding=SHORT)
    with _client(hy_mt_onnx_dir) as client:
        answer = client.post("/translate", json={"q": f"{POST}\n\n{SENTENCES[1]}", "source": "en", "target": "zh"})
        assert answer.status_code == 200, answer.text
        assert _decoded(client) == 2  # two paragraphs, each one prompt
    whole = [t.text for t in translator.translate([POST, SENTENCES[1]], source_lang="en", target_lang="zh")]
    assert answer.json()["translatedText"] == "\n\n".join(whole)


@pytest.mark.parametrize(("family", "target"), [("translategemma", "de"), ("qwen3", "zh"), ("hy_mt", "fr")])
def test_each_decoder_only_family_gets_a_paragraph_and_text_unit_overrides_it(
    request: pytest.FixtureRequest, family: str, target: str
) -> None:
    """The unit is a fact of the family's registry entry (paragraph for the three decoder-only families); with
    --text-unit sentence the same post reaches the model as its five sentences."""
    directory = request.getfixturevalue(f"{family}_onnx_dir")
    translator = Translator(directory, decoding=SHORT)
    assert text_unit(translator.manifest.architecture) == PARAGRAPH
    body = {"q": POST, "source": "en", "target": target}
    with _client(directory) as client:
        whole = client.post("/translate", json=body)
        assert whole.status_code == 200 and _decoded(client) == 1, whole.text
    with _client(directory, text_unit="sentence") as client:
        cut = client.post("/translate", json=body)
        assert cut.status_code == 200 and _decoded(client) == 5, cut.text
    assert whole.json()["translatedText"] == translator.translate([POST], source_lang="en", target_lang=target)[0].text
    sentences = [t.text for t in translator.translate(SENTENCES, source_lang="en", target_lang=target)]
    assert cut.json()["translatedText"] == join(split_sentences(POST), sentences)
