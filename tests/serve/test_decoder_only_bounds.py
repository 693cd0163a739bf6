"""The service's bounds on what a request adds to a decoder-only prompt (HY-MT's glossary and context), tested by
doubling: a glossary of N, 2N and 4N pairs, a term of N, 2N and 4N characters, a context of N, 2N and 4N
characters. Under each bound the answer is the library's and the request costs what the library says; past it, a
400 (or the 413 of the request's cost) naming the bound, at once, and the server still answers afterwards. The
server's limits here: 2N pairs, 4N characters of context, so that its 4N context passes the setting and meets
the model's own bound (the tiny HY-MT's 1024 positions)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from onnxmt import Translator
from onnxmt.runtime.options import RuntimeOptions
from tests.helpers.server import Server, assert_error, start_server
from tests.runtime.test_decoder_only_bounds import CONTEXT, NEW_TOKENS, PAIR, TERMS, TEXT, context, glossary, holding

TERM_CHARS = 100  # a pair of a term this long and one character: 101 characters of glossary


@pytest.fixture(scope="module")
def library(hy_mt_onnx_dir: Path) -> Translator:
    return Translator(hy_mt_onnx_dir, RuntimeOptions(threads=1))


@pytest.fixture(scope="module")
def served(hy_mt_onnx_dir: Path, library: Translator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The tiny HY-MT served with 2N glossary pairs, 2N pairs' characters, 4N characters of context, and a
    request cost of the dearest request under those that is sent whole (`_passing`)."""
    running = start_server(
        hy_mt_onnx_dir,
        tmp_path_factory.mktemp("bounds-serve"),
        max_glossary_terms=2 * TERMS,
        max_glossary_chars=sum(len(s) + len(t) for s, t in glossary(2 * TERMS)),
        max_context_chars=4 * CONTEXT,
        max_request_cost=max(library.cost([text], **PAIR, max_new_tokens=NEW_TOKENS, **r) for text, r in _passing()),
    )
    yield running
    assert running.stop() == 0, running.logs()


def _passing() -> list[tuple[str, dict[str, Any]]]:
    """The largest requests the tests send whole: a text under 2N pairs, a term of 2N characters, a context of 2N
    characters."""
    term = "w" * 2 * TERM_CHARS
    return [
        (holding(4 * TERMS), {"glossary": glossary(2 * TERMS)}),
        (f"{TEXT} {term}", {"glossary": {term: "x"}}),
        (TEXT, {"context": context(2 * CONTEXT)}),
    ]


def _post(server: Server, q: str | list[str], **request: Any) -> httpx.Response:
    body = {"q": q, "source": PAIR["source_lang"], "target": PAIR["target_lang"], "max_new_tokens": NEW_TOKENS}
    return httpx.post(f"{server.url}/translate", json={**body, **request}, timeout=60)


def _library(library: Translator, text: str, **request: Any) -> str:
    return library.translate([text], **PAIR, max_new_tokens=NEW_TOKENS, **request)[0].text


def test_a_glossary_of_n_2n_4n_pairs(served: Server, library: Translator) -> None:
    text = holding(4 * TERMS)
    for n in (TERMS, 2 * TERMS):
        answer = _post(served, text, glossary=glossary(n))
        assert answer.status_code == 200, answer.text
        assert answer.json()["translatedText"] == _library(library, text, glossary=glossary(n))
    error = assert_error(_post(served, text, glossary=glossary(4 * TERMS)), 400)
    assert f"the glossary has {4 * TERMS} pairs; the limit is {2 * TERMS}" in error
    # Its cost is the library's, grown by the terms each text holds; enough such texts pass --max-request-cost.
    one = {n: library.cost([text], **PAIR, glossary=glossary(n), max_new_tokens=NEW_TOKENS) for n in (TERMS, 2 * TERMS)}
    assert one[TERMS] < one[2 * TERMS]
    limit = max(library.cost([t], **PAIR, max_new_tokens=NEW_TOKENS, **r) for t, r in _passing())
    many = [text] * (limit // one[2 * TERMS] + 1)
    error = assert_error(_post(served, many, glossary=glossary(2 * TERMS)), 413)
    assert f"it costs {len(many) * one[2 * TERMS]} tokens x beams" in error and f"the limit is {limit}" in error


def test_a_term_of_n_2n_4n_characters(served: Server, library: Translator) -> None:
    for chars in (TERM_CHARS, 2 * TERM_CHARS):
        term = "w" * chars
        answer = _post(served, f"{TEXT} {term}", glossary={term: "x"})
        assert answer.status_code == 200, answer.text
        assert answer.json()["translatedText"] == _library(library, f"{TEXT} {term}", glossary={term: "x"})
    term = "w" * 4 * TERM_CHARS
    error = assert_error(_post(served, f"{TEXT} {term}", glossary={term: "x"}), 400)
    limit = sum(len(s) + len(t) for s, t in glossary(2 * TERMS))
    assert f"the glossary has {len(term) + 1} characters; the limit is {limit}" in error


def test_a_context_of_n_2n_4n_8n_characters(served: Server, library: Translator) -> None:
    """N and 2N: translated as the library does. 4N passes --max-context-chars but its prompt passes the model's
    positions: a 400 naming the prompt's tokens (for /translate) or saying that no text fits (for a document),
    before any of it runs. 8N: past --max-context-chars."""
    for chars in (CONTEXT, 2 * CONTEXT):
        answer = _post(served, TEXT, context=context(chars))
        assert answer.status_code == 200, answer.text
        assert answer.json()["translatedText"] == _library(library, TEXT, context=context(chars))
    tokens = len(library.model_input(TEXT, **PAIR, context=context(4 * CONTEXT)).ids)
    error = assert_error(_post(served, TEXT, context=context(4 * CONTEXT)), 400)
    assert f"has {tokens} tokens" in error and "at most 1024" in error and "context" in error
    page = assert_error(_post(served, f"<p>{TEXT}</p>", format="html", context=context(4 * CONTEXT)), 400)
    assert "no text fits: shorten the context" in page
    error = assert_error(_post(served, TEXT, context=context(8 * CONTEXT)), 400)
    assert f"context has {8 * CONTEXT} characters, the limit is {4 * CONTEXT}" in error
    # Nothing was left running: the next request is answered as before.
    answer = _post(served, TEXT)
    assert answer.status_code == 200 and answer.json()["translatedText"] == _library(library, TEXT), answer.text
