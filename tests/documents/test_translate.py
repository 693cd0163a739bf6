"""onnxmt.documents: sentences, long sentences, HTML, Markdown, subtitles, Word files, on the tiny random model."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import pytest

from onnxmt import DecodeOptions, Translator
from onnxmt.documents import split_sentences, translate_document, translate_file, translate_string, translate_texts
from onnxmt.documents.html import parse, translate_html
from onnxmt.documents.inline import place
from onnxmt.documents.markdown import translate_markdown
from onnxmt.documents.segment import Piece, fit, join
from onnxmt.documents.subtitles import cues, translate_subtitles
from onnxmt.testing import generate_corpus
from tests.helpers.office import docx_structure, make_docx
from tests.helpers.skips import importorskip

ENGLISH = generate_corpus(3, lines=40)[0]


@pytest.fixture(scope="module")
def translator(tiny_onnx_dir: Path) -> Translator:
    return Translator(tiny_onnx_dir, decoding=DecodeOptions(max_new_tokens=6))


def sentences(text: str, lang: str = "en") -> list[str]:
    return [p.text for p in split_sentences(text, lang) if p.translate]


def upper(texts: list[str]) -> list[str]:
    return [t.upper() for t in texts]


def test_abbreviations_and_numbers_do_not_end_sentences() -> None:
    text = "Dr. Smith paid $3.50 at 9 a.m. on Jan. 5, e.g. for the U.S. office. Then he left."
    assert sentences(text) == ["Dr. Smith paid $3.50 at 9 a.m. on Jan. 5, e.g. for the U.S. office.", "Then he left."]


def test_quotes_stay_with_their_sentence() -> None:
    assert sentences('He said "Stop." Then he went. "Is it true?" she asked.') == [
        'He said "Stop."',
        "Then he went.",
        '"Is it true?" she asked.',
    ]


def test_chinese_and_japanese_end_marks() -> None:
    assert sentences("他说：“我们有老鼠。”和专家一样，他持怀疑态度。真的吗？是的！", "zh") == [
        "他说：“我们有老鼠。”",
        "和专家一样，他持怀疑态度。",
        "真的吗？",
        "是的！",
    ]
    assert sentences("日本語の文です。二つ目の文！", "ja") == ["日本語の文です。", "二つ目の文！"]


def test_whitespace_line_breaks_and_blank_lines_are_kept() -> None:
    text = "  First one. Second one.\n\n\nThird\none.  \n---\n\n"
    pieces = split_sentences(text)
    assert "".join(p.text for p in pieces) == text
    assert [p.text for p in pieces if p.translate] == ["First one.", "Second one.", "Third", "one."]
    assert join(pieces, ["A.", "B.", "C", "D."]) == "  A. B.\n\n\nC\nD.  \n---\n\n"


def test_sentences_rejoin_with_the_target_scripts_convention() -> None:
    english = split_sentences("One. Two! Three?")
    assert join(english, ["一。", "二！", "三？"]) == "一。二！三？"
    assert join(split_sentences("第一。第二！", "zh"), ["One.", "Two!"]) == "One. Two!"
    assert join(english, ["Un.", "Deux !", "Trois ?"]) == "Un. Deux ! Trois ?"


def test_a_sentence_too_long_is_cut_on_clause_boundaries_and_never_loses_text() -> None:
    text = "alpha beta, gamma delta epsilon; zeta eta theta iota kappa lambda mu"
    pieces = fit([Piece(text, True)], lambda s: len(s.split()), 4)
    parts = [p.text for p in pieces if p.translate]
    assert parts[:2] == ["alpha beta,", "gamma delta epsilon;"]  # clause marks first
    assert all(len(p.split()) <= 4 for p in parts)
    assert "".join(p.text for p in pieces) == text
    # No space and no clause mark: cut between characters, still nothing lost.
    chinese = fit([Piece("一二三四五六七八九十", True)], len, 3)
    assert [p.text for p in chinese] == ["一二三", "四五六", "七八九", "十"]


def test_marks_keep_their_order_and_words() -> None:
    assert place([0, 5, 11], 11, "HELLO WORLD") == [0, 5, 11]
    assert place([4], 11, "BONJOUR MONDE") == [7]  # moved to the word boundary nearest 4 * 13 / 11
    assert place([3, 3, 7], 9, "一二三四五六") == [2, 2, 5]


def test_a_document_is_one_translate_call_with_its_paragraphs_kept(translator: Translator) -> None:
    paragraphs = [" ".join(ENGLISH[i : i + 3]) for i in range(0, 12, 3)]
    text = "\n\n".join(paragraphs) + "\n"
    calls: list[list[str]] = []
    translate = translator.translate_prepared

    def counted(prepared, **kw):  # type: ignore[no-untyped-def]
        calls.append([p.text for p in prepared])
        return translate(prepared, **kw)

    translator.translate_prepared = counted  # type: ignore[method-assign]
    try:
        out = translate_document(translator, text)
    finally:
        del translator.translate_prepared
    assert len(calls) == 1 and calls[0] == sentences(text)
    assert out.endswith("\n") and out.count("\n") == text.count("\n")
    assert len(out.split("\n\n")) == 4 and all(p.strip() for p in out.split("\n\n"))


def test_a_3000_token_paragraph_is_translated_whole(translator: Translator) -> None:
    words = " ".join(" ".join(ENGLISH) for _ in range(6)).replace(".", ",").replace("?", ",").replace("!", ",")
    counter = copy.copy(translator.tokenizer)
    counter.model_max_length = 0  # no truncation
    assert len(counter.encode(words)) >= 3000
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the tokenizer warns when it truncates
        calls: list[list[str]] = []
        translate = translator.translate_prepared
        translator.translate_prepared = lambda ps, **kw: calls.append([p.text for p in ps]) or translate(ps, **kw)  # type: ignore[method-assign]
        try:
            out = translate_document(translator, words, max_new_tokens=2)
        finally:
            del translator.translate_prepared
    limit = translator.tokenizer.model_max_length
    assert len(calls[0]) > 3000 // limit
    assert all(len(counter.encode(s)) <= limit for s in calls[0])
    assert "".join(calls[0]).replace(" ", "") == words.replace(" ", "")  # every word went to the model
    assert out.strip()


def test_html_keeps_tags_attributes_and_untouched_elements(translator: Translator) -> None:
    page = (
        '<!doctype html>\n<html lang="en"><head><title>A page</title><style>p { color: red; }</style></head>\n'
        '<body><h1 id="top">Hello world</h1>\n<p class="lead">This is <b>bold</b> and <a href="/x?a=1&amp;b=2">a '
        "link</a>. A second sentence.</p>\n<pre>keep   this</pre><p>Run <code>ls -l</code> now &amp; then.</p>"
        '<script>var s = "<b>not a tag</b>";</script><ul><li>one <i>item</i></li></ul><br>tail</body></html>\n'
    )
    out = translate_html(page, lambda texts: translate_texts(translator, texts))
    tags = [(e.kind, e.raw) for e in parse(page) if e.kind != "data"]
    assert [(e.kind, e.raw) for e in parse(out) if e.kind != "data"] == tags
    for kept in ("<pre>keep   this</pre>", "<code>ls -l</code>", '<script>var s = "<b>not a tag</b>";</script>'):
        assert kept in out
    assert "<style>p { color: red; }</style>" in out and "Hello world" not in out
    # Upper-casing shows where the text went: inline tags around the same words.
    assert translate_html(page, upper).count('<a href="/x?a=1&amp;b=2">A LINK</a>.') == 1


def test_markdown_keeps_code_blocks_and_spans() -> None:
    source = (
        "# A title\n\nUse `pip install x` and [the docs](http://example.com/a_b) for **more**.\n\n"
        "```python\nprint('hello world')\n```\n\n    indented code here\n\n- one item\n1. two items\n"
    )
    assert translate_markdown('[docs]: http://example.com/a "Title"\n', upper) == (
        '[DOCS]: http://example.com/a "Title"\n'
    )
    out = translate_markdown(source, upper)
    assert out == (
        "# A TITLE\n\nUSE `pip install x` AND [THE DOCS](http://example.com/a_b) FOR **MORE**.\n\n"
        "```python\nprint('hello world')\n```\n\n    indented code here\n\n- ONE ITEM\n1. TWO ITEMS\n"
    )


SRT = """1
00:00:01,000 --> 00:00:03,500
Hello there,
how are you?

2
00:00:04,000 --> 00:00:06,000
I am fine. Thank you.

"""
VTT = "WEBVTT\n\nNOTE a comment\n\ncue-1\n00:01.000 --> 00:03.500 align:start\nHello there,\nhow are you?\n"


def test_subtitles_keep_numbers_and_timings_and_join_a_cues_lines() -> None:
    out = translate_subtitles(SRT, upper)
    assert out == (
        "1\n00:00:01,000 --> 00:00:03,500\nHELLO THERE, HOW ARE YOU?\n\n"
        "2\n00:00:04,000 --> 00:00:06,000\nI AM FINE. THANK YOU.\n"
    )
    vtt = translate_subtitles(VTT, upper)
    assert vtt.startswith("WEBVTT\n\nNOTE a comment\n\ncue-1\n00:01.000 --> 00:03.500 align:start\nHELLO THERE, HOW")


def test_srt_through_the_model_keeps_its_timings(translator: Translator, tmp_path: Path) -> None:
    (tmp_path / "in.srt").write_text(SRT, encoding="utf-8")
    translate_file(translator, tmp_path / "in.srt", tmp_path / "out.srt")
    before, after = cues(SRT), cues((tmp_path / "out.srt").read_text(encoding="utf-8"))
    assert [head for head, _ in after] == [head for head, _ in before]
    assert all(len(lines) == 1 for _, lines in after)


def test_docx_keeps_paragraph_styles_and_run_formatting(translator: Translator, tmp_path: Path) -> None:
    importorskip("docx")
    make_docx(tmp_path / "in.docx")
    translate_file(translator, tmp_path / "in.docx", tmp_path / "out.docx")
    assert docx_structure(tmp_path / "out.docx") == docx_structure(tmp_path / "in.docx")
    import docx

    texts = [p.text for p in docx.Document(str(tmp_path / "out.docx")).paragraphs]
    assert "A title for the document" not in texts and all(t.strip() for t in texts)


def test_formats_by_name_and_errors(translator: Translator) -> None:
    assert translate_string(translator, "", "text") == ""
    with pytest.raises(ValueError, match="valid formats: text, srt, vtt, html, markdown"):
        translate_string(translator, "x", "pdf")
    with pytest.raises(ValueError, match="valid extensions"):
        translate_file(translator, "in.pdf", "out.pdf")


def test_any_markup_parses_losslessly_or_raises_value_error() -> None:
    import random

    alphabet = [*"<>/!-=\"' ab\n&;#", "<b>", "</b>", "<a href='x'>", "<script>", "<pre>", "</pre>", "<!--", "-->"]
    alphabet += ["<![", "&amp;", "\r", "\x0c", "\u2028", "。", "`", "*", "[", "](", ")", "```", "\n    ", "<br/>"]
    rng = random.Random(0)
    for _ in range(500):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        assert "".join(p.text for p in split_sentences(text)) == text
        translate_markdown(text, upper)
        translate_subtitles(text, upper)
        try:
            events = parse(text)
        except ValueError:
            continue
        assert "".join(e.raw for e in events) == text
        tags = [e.raw for e in events if e.kind != "data"]
        assert [e.raw for e in parse(translate_html(text, upper)) if e.kind != "data"] == tags
    assert translate_html("", upper) == ""
    with pytest.raises(ValueError, match="malformed HTML"):
        translate_html("<![<p>", upper)


def test_a_plan_carries_each_sentences_ids_and_bounds_their_total(translator: Translator) -> None:
    """The ids a plan carries are what `prepare` would make (so no sentence is tokenized twice), and their total is
    bounded (the service's --max-document-cost): one token over the bound is refused, the bound itself is not."""
    from onnxmt.documents.limits import DocumentLimits, DocumentTooLarge
    from onnxmt.documents.translate import counting, plan_texts

    text = " ".join(ENGLISH[:6])
    plan = plan_texts([text], counting(translator), tokenizer=translator.tokenizer)
    prepared = translator.prepare(plan.sentences)
    assert [tuple(ids) for ids in plan.ids] == [p.ids for p in prepared]
    total = sum(plan.tokens)
    assert plan_texts([text], counting(translator), DocumentLimits(max_tokens=total)).tokens == plan.tokens
    with pytest.raises(DocumentTooLarge, match="max_document_cost"):
        plan_texts([text], counting(translator), DocumentLimits(max_tokens=total - 1))
    # Twice the text, twice the tokens: the bound scales with the document, as the cost it stands for.
    doubled = plan_texts([text + " " + text], counting(translator), DocumentLimits(max_tokens=2 * total + 2))
    assert 2 * total - 2 <= sum(doubled.tokens) <= 2 * total + 2


def test_a_lone_surrogate_is_a_value_error_before_the_sentence_splitter(translator: Translator) -> None:
    with pytest.raises(ValueError, match=r"texts\[0\] is not valid Unicode text: a lone surrogate"):
        translate_document(translator, "Hello. \udc00 there.")
