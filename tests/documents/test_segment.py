"""Sentences by language (documents/segment.py): each language's abbreviations, Chinese and Japanese end marks,
mixed scripts, and the joins between translated sentences of two scripts. Expectations are written by hand, as a
reader of the language cuts the text, not computed with the code under test."""

from __future__ import annotations

import pytest

from onnxmt.documents.segment import join, split_sentences


def sentences(text: str, lang: str) -> list[str]:
    return [p.text for p in split_sentences(text, lang) if p.translate]


# (language, text, its sentences): abbreviations and ordinals that English rules would take for sentence ends.
BY_LANGUAGE = [
    ("de", "Am 3. Oktober war Feiertag. Dann kam der Winter.", ["Am 3. Oktober war Feiertag.", "Dann kam der Winter."]),
    ("de", "Das war im Okt. letzten Jahres. Es regnete.", ["Das war im Okt. letzten Jahres.", "Es regnete."]),
    ("de", "Es gibt Birnen usw. im Laden. Wir kaufen ein.", ["Es gibt Birnen usw. im Laden.", "Wir kaufen ein."]),
    ("es", "La Sra. García llegó tarde. Nadie la esperaba.", ["La Sra. García llegó tarde.", "Nadie la esperaba."]),
    ("es", "Vivo en la Avda. de la Paz. Es bonita.", ["Vivo en la Avda. de la Paz.", "Es bonita."]),
    ("fr", "Voir p. ex. le chapitre deux. Il est court.", ["Voir p. ex. le chapitre deux.", "Il est court."]),
    ("fr", "Le film commence à 20 h. Nous arrivons tôt.", ["Le film commence à 20 h.", "Nous arrivons tôt."]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("lang", "text", "expected"), BY_LANGUAGE, ids=[f"{c[0]}-{i}" for i, c in enumerate(BY_LANGUAGE)]
)
def test_each_language_is_cut_by_its_own_abbreviations(lang: str, text: str, expected: list[str]) -> None:
    assert sentences(text, lang) == expected
    assert sentences(text, "en") != expected  # the premise: English rules cut it otherwise


@pytest.mark.xfail(
    strict=True,
    reason="sentencex 1.0 ends a sentence at an ordinal before a capital ('3. Okt.') "
    "and after a French title ('M. Dupont'); strict: a sentencex that gets them right fails this",
)
@pytest.mark.parametrize(
    ("lang", "text", "expected"),
    [
        ("de", "Er wurde am 3. Okt. geboren. Sie nicht.", ["Er wurde am 3. Okt. geboren.", "Sie nicht."]),
        ("fr", "M. Dupont est arrivé. Il était en retard.", ["M. Dupont est arrivé.", "Il était en retard."]),
    ],
    ids=["de-ordinal", "fr-title"],
)
def test_known_limits_of_the_segmenter(lang: str, text: str, expected: list[str]) -> None:
    assert sentences(text, lang) == expected


@pytest.mark.parametrize(
    ("lang", "text", "expected"),
    [
        ("zh", "会议于3.5小时后结束。大家都回家了！真的吗？", ["会议于3.5小时后结束。", "大家都回家了！", "真的吗？"]),
        ("zh", "他住在北京，今年三十岁。你呢？", ["他住在北京，今年三十岁。", "你呢？"]),
        ("ja", "今日は晴れです。公園に行きましょう！本当？", ["今日は晴れです。", "公園に行きましょう！", "本当？"]),
    ],
)  # fmt: skip
def test_chinese_and_japanese_sentences_end_at_their_marks_without_spaces(
    lang: str, text: str, expected: list[str]
) -> None:
    pieces = split_sentences(text, lang)
    assert [p.text for p in pieces if p.translate] == expected
    assert "".join(p.text for p in pieces) == text


@pytest.mark.parametrize("lang", ["zh", "ja", "en"])
def test_mixed_scripts_are_cut_at_each_sentence_whatever_the_language(lang: str) -> None:
    text = "他住在北京。He lives in Beijing. 他很开心！"
    assert sentences(text, lang) == ["他住在北京。", "He lives in Beijing.", "他很开心！"]


# What goes between two translated sentences: nothing between two Chinese or Japanese ones, a space wherever
# either side is written with spaces, whichever script comes first; line breaks as in the source.
JOINS = [
    ("One. Two. Three.", "en", ["一。", "二！", "三？"], "一。二！三？"),
    ("One. Two. Three.", "en", ["Hello.", "你好。", "Bye."], "Hello. 你好。 Bye."),
    ("One. Two. Three.", "en", ["你好。", "Hello.", "再见。"], "你好。 Hello. 再见。"),
    ("他住在北京。He lives in Beijing. 他很开心！", "zh", ["He lives in Beijing.", "他住在北京。", "He is happy!"],
     "He lives in Beijing. 他住在北京。 He is happy!"),
    ("他住在北京。他很开心！", "zh", ["東京です。", "晴れです。"], "東京です。晴れです。"),
    ("第一。\n第二！", "zh", ["One.", "Two!"], "One.\nTwo!"),
    ("One.\n\nTwo.", "en", ["一。", "二。"], "一。\n\n二。"),
]  # fmt: skip


JOIN_IDS = ["chinese", "latin-chinese-latin", "chinese-latin-chinese", "mixed-source", "japanese", "line", "lines"]


@pytest.mark.parametrize(("source", "lang", "translations", "expected"), JOINS, ids=JOIN_IDS)
def test_translated_sentences_are_joined_by_the_scripts_on_both_sides(
    source: str, lang: str, translations: list[str], expected: str
) -> None:
    assert join(split_sentences(source, lang), translations) == expected
