"""Document preparation grows linearly with its input: each case is timed on an input of size n and on one of 2n,
and the ratio of the two times must stay below 3 (linear gives about 2, quadratic 4). Sizes are such that a run
takes 50 ms or more on the tiny model; each case checks its result as well."""

from __future__ import annotations

import copy
import gc
import html
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from onnxmt import Translator
from onnxmt.documents import split_sentences
from onnxmt.documents.html import parse, prepare_html
from onnxmt.documents.inline import place
from onnxmt.documents.markdown import prepare_markdown
from onnxmt.documents.segment import Piece, fit
from onnxmt.documents.subtitles import prepare_subtitles
from onnxmt.testing import generate_corpus

# Words without sentence or clause punctuation: one long sentence that can only be cut at spaces.
WORDS = " ".join(generate_corpus(3, lines=40)[0]).translate(str.maketrans("", "", ".?!,"))
MAX_GROWTH = 3.0
Count = Callable[[str], int]


@pytest.fixture(scope="module")
def counting(tiny_onnx_dir: Path) -> tuple[Count, int]:
    """The tiny model's count of a sentence's tokens as `layout` counts it (never truncated), and its limit."""
    tokenizer = copy.copy(Translator(tiny_onnx_dir).tokenizer)
    limit = tokenizer.model_max_length
    tokenizer.model_max_length = 0
    return lambda text: len(tokenizer.encode(text)), limit


def repeat(text: str, length: int) -> str:
    return (text * (length // len(text) + 1))[:length]


def growth(run: Callable[[Any], object], make: Callable[[int], Any], n: int) -> tuple[float, float]:
    """The best of five times of `run` on `make(n)` and on `make(2 * n)`, measured in turns (so that a change of
    load on the machine falls on both) and without garbage collection (whose cost depends on all that is alive,
    not on this input)."""
    inputs = [make(n), make(2 * n)]
    best = [float("inf")] * 2
    gc.collect()
    gc.disable()
    try:
        for _ in range(5):
            for k, value in enumerate(inputs):
                start = time.perf_counter()
                run(value)
                best[k] = min(best[k], time.perf_counter() - start)
    finally:
        gc.enable()
    return best[0], best[1]


def assert_linear(run: Callable[[Any], object], make: Callable[[int], Any], n: int) -> None:
    single, double = growth(run, make, n)
    assert double / single < MAX_GROWTH, f"{single:.3f} s at n={n}, {double:.3f} s at 2n"


def translated(prepare: Callable[[str], tuple[list[str], Callable[[list[str]], str]]]) -> Callable[[str], str]:
    """`prepare` and then its rebuild, with upper-casing for the translation."""

    def run(source: str) -> str:
        texts, rebuild = prepare(source)
        return rebuild([text.upper() for text in texts])

    return run


def assert_fitted(pieces: list[Piece], text: str, count: Count, limit: int) -> None:
    assert "".join(p.text for p in pieces) == text
    parts = [p.text for p in pieces if p.translate]
    assert len(parts) > 1 and all(count(part) <= limit for part in parts)


def test_a_long_sentence_without_a_space_is_cut_in_linear_time(counting: tuple[Count, int]) -> None:
    count, limit = counting
    text = repeat(WORDS.replace(" ", ""), 10_000)
    assert_fitted(fit([Piece(text, True)], count, limit), text, count, limit)
    assert_linear(lambda t: fit([Piece(t, True)], count, limit), lambda n: repeat(text, n), 5_000)


def test_a_long_sentence_without_clause_marks_is_cut_at_spaces_in_linear_time(counting: tuple[Count, int]) -> None:
    count, limit = counting
    text = repeat(WORDS, 20_000)
    pieces = fit([Piece(text, True)], count, limit)
    assert_fitted(pieces, text, count, limit)
    assert {p.text for p in pieces if not p.translate} == {" "}  # cut at spaces only
    assert_linear(lambda t: fit([Piece(t, True)], count, limit), lambda n: repeat(text, n), 10_000)


def test_a_flood_of_blank_lines_is_split_in_linear_time() -> None:
    text = "One.\n" + "\n" * 1000 + "Two.\r\n \n"
    assert [(p.text, p.translate) for p in split_sentences(text)] == [
        ("One.", True),
        ("\n" * 1001, False),
        ("Two.", True),
        ("\r\n \n", False),
    ]
    assert_linear(split_sentences, lambda n: "a" + "\n" * n + "b", 150_000)


def test_many_marks_in_a_long_text_without_boundaries_are_placed_in_linear_time() -> None:
    # No boundary but the ends: each mark goes to the nearer end, in order.
    assert place(range(1, 10), 10, "x" * 10) == [0, 0, 0, 0, 0, 10, 10, 10, 10]
    assert_linear(lambda n: place(range(1, n), n, "x" * n), lambda n: n, 60_000)


def test_html_entity_runs_are_parsed_and_cut_in_linear_time(counting: tuple[Count, int]) -> None:
    count, limit = counting

    def run(page: str) -> list[list[Piece]]:
        return [fit(split_sentences(text), count, limit) for text in prepare_html(page)[0]]

    source = "&a;" * 1000 + "<b>x</b>" + "&amp;" * 1000
    assert "".join(e.raw for e in parse(source)) == source
    assert prepare_html(source)[0] == [html.unescape(source.replace("<b>", "").replace("</b>", ""))]
    # One sentence of unknown entities (kept as text, and translated): parsed, then cut as any other.
    (pieces,) = run("&a;" * 3000)
    assert_fitted(pieces, "&a;" * 3000, count, limit)
    assert_linear(run, lambda n: "&a;" * n, 3_000)


def test_an_unclosed_comment_swallows_the_rest_in_linear_time() -> None:
    source = "<p>Kept.</p><!--" + "<p>Hello <b>world</b>, how are you?</p>\n" * 100
    events = parse(source)
    assert "".join(e.raw for e in events) == source
    assert events[-1].kind == "other" and events[-1].raw == source[len("<p>Kept.</p>") :]
    assert prepare_html(source)[0] == ["Kept."]  # as in a browser: all after `<!--` is the comment
    assert_linear(prepare_html, lambda n: "<!--" * n, 750_000)


def test_an_unclosed_section_is_a_comment_to_the_next_gt_in_linear_time() -> None:
    source = "<![CDATA[<p>Hello <b>world</b>.</p>" + "<![CDATA[x>" * 3
    events = parse(source)
    assert "".join(e.raw for e in events) == source
    assert [e.raw for e in events if e.kind == "other"] == ["<![CDATA[<p>", *["<![CDATA[x>"] * 3]
    assert prepare_html(source)[0] == ["Hello world."]
    assert_linear(prepare_html, lambda n: "<![CDATA[x>" * n, 15_000)


def test_an_unclosed_tag_or_instruction_swallows_the_rest_in_linear_time() -> None:
    # Unclosed: an attribute's quote open to the end, or no `>` after `<?`, `</`, `<!`.
    for opening, text in (("<a b='", "<p>Hello.</p>"), ("<?x ", "Hello."), ("</a ", "Hello."), ("<!x ", "Hello.")):
        source = "<p>Kept.</p>" + opening + text * 10
        assert [(e.kind, e.raw) for e in parse(source)][-1] == ("other", opening + text * 10)
        assert prepare_html(source)[0] == ["Kept."]
    assert_linear(prepare_html, lambda n: "<a b='" * n, 100_000)


def test_a_long_text_in_an_html_page_is_cut_in_linear_time(counting: tuple[Count, int]) -> None:
    count, limit = counting

    def run(page: str) -> list[list[Piece]]:
        return [fit(split_sentences(text), count, limit) for text in prepare_html(page)[0]]

    page = "<html><body><p>" + repeat(WORDS, 10_000) + "</p></body></html>"
    (pieces,) = run(page)
    assert_fitted(pieces, repeat(WORDS, 10_000), count, limit)
    assert_linear(run, lambda n: "<p>" + repeat(WORDS, n) + "</p>", 10_000)


def test_many_inline_tags_go_back_in_linear_time() -> None:
    source = "<p>" + "a <b>b</b> " * 100 + "</p>"
    assert translated(prepare_html)(source) == "<p>" + "A <b>B</b> " * 100 + "</p>"
    # Without word boundaries (the case timed), the tags go to the nearer end of the text, in order.
    assert translated(prepare_html)("<p>ab<b>abab</b>ab</p>") == "<p><b>ABABABAB</b></p>"
    assert_linear(translated(prepare_html), lambda n: "<p>" + "a<b>b</b>" * n + "</p>", 3_000)


def test_many_small_cues_are_read_and_written_in_linear_time() -> None:
    def srt(n: int) -> str:
        return "".join(f"{i}\n00:00:0{i % 10},000 --> 00:00:0{i % 10},500\nHi there,\nyou.\n\n" for i in range(n))

    assert translated(prepare_subtitles)(srt(3)) == srt(3).replace("Hi there,\nyou.", "HI THERE, YOU.")[:-1]
    assert_linear(translated(prepare_subtitles), srt, 15_000)


@pytest.mark.parametrize(
    ("unit", "n"),
    [
        ("x`y`", 12_000),  # code spans in a text without word boundaries
        ("a`", 12_000),  # backticks
        ("a<", 30_000),  # `<` without `>`
        ("a](", 30_000),  # `](` without `)`
        ("a[", 30_000),  # `[` runs: link labels to look for, in markdown-it's inline parser
        ("> ", 200_000),  # block markers
    ],
)
def test_a_long_markdown_line_is_read_and_written_in_linear_time(unit: str, n: int) -> None:
    line = " ".join([unit] * 50) + " z"
    out = translated(prepare_markdown)(line)
    assert out.lower() == line.lower() and out != line
    assert_linear(translated(prepare_markdown), lambda size: unit * size + "z", n)
