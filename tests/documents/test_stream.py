"""`onnxmt.documents.translate_stream`: what it streams joins to the non-streamed translation."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from onnxmt import DecodeOptions, Translator
from onnxmt.documents import translate_document, translate_stream
from onnxmt.documents.translate import layout
from onnxmt.testing import generate_corpus

ENGLISH = generate_corpus(5, lines=24)[0]
DOCUMENT = "\n\n".join(" ".join(ENGLISH[i : i + 4]) for i in range(0, 24, 4)) + "\n"


@pytest.fixture(scope="module")
def translator(tiny_onnx_dir: Path) -> Translator:
    return Translator(tiny_onnx_dir, decoding=DecodeOptions(max_new_tokens=12))


# The tiny model's generation config asks for 4 beams, as opus-mt's does: greedy is beams=1.
@pytest.mark.parametrize(
    "overrides", [{"beams": 1}, {"beams": 1, "batch_size": 3}, {"beams": 1, "batch_size": 1, "min_new_tokens": 5}]
)
def test_greedy_stream_equals_the_translation(translator: Translator, overrides: dict) -> None:
    pieces = list(translate_stream(translator, DOCUMENT, **overrides))
    assert "".join(pieces) == translate_document(translator, DOCUMENT, **overrides)
    assert all(pieces)
    if overrides.get("batch_size") == 1:  # token by token: sentences of 5 tokens or more come in several pieces
        assert len(pieces) > 3 * len(ENGLISH)


def test_beam_stream_equals_the_translation_sentence_by_sentence(translator: Translator) -> None:
    pieces = list(translate_stream(translator, DOCUMENT, beams=3, batch_size=4))
    assert "".join(pieces) == translate_document(translator, DOCUMENT, beams=3)
    # One piece a sentence (the separators between them aside).
    sentences = [p.text for p in layout(translator, DOCUMENT) if p.translate]
    expected = [t.text for t in translator.translate(sentences, beams=3)]
    assert [p for p in pieces if p.strip()] == [t for t in expected if t.strip()]


def test_one_sentence_streams_its_tokens(translator: Translator) -> None:
    text = ENGLISH[0]
    pieces = list(translate_stream(translator, text, beams=1, min_new_tokens=10))
    assert "".join(pieces) == translator.translate([text], beams=1, min_new_tokens=10)[0].text
    assert len([p for p in pieces if p]) >= 3
    assert list(translate_stream(translator, "")) == [] and "".join(translate_stream(translator, "  \n")) == "  \n"


def test_the_first_words_come_before_the_rest_are_done(translator: Translator) -> None:
    step = translator.graphs.step

    def slow(*args, **kwargs):  # type: ignore[no-untyped-def]
        time.sleep(0.02)
        return step(*args, **kwargs)

    translator.graphs.step = slow  # type: ignore[method-assign]
    try:
        started = time.monotonic()
        stream = translate_stream(translator, DOCUMENT, beams=1, min_new_tokens=11, batch_size=4)
        first = next(p for p in stream if p.strip())
        first_at = time.monotonic() - started
        rest = "".join(stream)
        total = time.monotonic() - started
    finally:
        del translator.graphs.step
    assert first and rest
    assert first_at < total / 10, (first_at, total)


def test_a_stream_closed_early_stops_its_batch(translator: Translator) -> None:
    calls = []
    step = translator.graphs.step

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        time.sleep(0.01)
        return step(*args, **kwargs)

    translator.graphs.step = counted  # type: ignore[method-assign]
    try:
        stream = translate_stream(translator, " ".join(ENGLISH[:4]), beams=1, max_new_tokens=60, min_new_tokens=60)
        next(p for p in stream if p.strip())
        stream.close()  # type: ignore[attr-defined]
    finally:
        del translator.graphs.step
    assert len(calls) < 30


def test_stream_errors(translator: Translator) -> None:
    with pytest.raises(TypeError, match="text must be a string"):
        translate_stream(translator, ["a list"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="beams must be at least 1"):
        translate_stream(translator, "hi", beams=0)
