"""onnxmt.languages: the codes clients send, mapped to a model's codes (opus-mt-en-zh's metadata)."""

from __future__ import annotations

import re

import pytest

from onnxmt.languages import ModelLanguages, display_name, match, public_codes
from onnxmt.testing.marian import OPUS_MT_EN_ZH_TARGETS

# opus-mt-en-zh as its tokenizer_config.json and vocab.json describe it.
EN_ZH = {
    "source": "eng",
    "target": "zho",
    "target_tokens": {lang: f">>{lang}<<" for lang in OPUS_MT_EN_ZH_TARGETS},
    "default_target": None,
}
SINGLE = {"source": "eng", "target": "zho", "target_tokens": {}, "default_target": None}


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("zh", "cmn_Hans"),  # ISO 639-1
        ("zt", "cmn_Hant"),  # LibreTranslate's Traditional Chinese
        ("zho", "cmn_Hans"),  # ISO 639-3
        ("zho_Hans", "cmn_Hans"),  # FLORES-200
        ("zho_Hant", "cmn_Hant"),
        ("zh-Hans", "cmn_Hans"),  # BCP-47
        ("zh-Hant", "cmn_Hant"),
        ("zh-TW", "cmn_Hant"),
        ("zh-HK", "cmn_Hant"),
        ("zh-CN", "cmn_Hans"),
        ("ZH_hant", "cmn_Hant"),
        ("cmn", "cmn"),  # the model's own codes first
        ("cmn_Hant", "cmn_Hant"),
        (">>cmn_Hant<<", "cmn_Hant"),  # Marian's token
        ("yue", "yue"),
        ("yue-Hant", "yue_Hant"),
        ("yue-HK", "yue_Hant"),
        ("yue_Hans", "yue_Hans"),
        ("lzh-Hans", "lzh_Hans"),
        ("cjy-Hans", "cjy_Hans"),
    ],
)
def test_target_codes_as_clients_send_them(code: str, expected: str) -> None:
    assert ModelLanguages(EN_ZH).resolve_target(code) == expected


@pytest.mark.parametrize("code", ["en", "eng", "eng_Latn", "en-US", "en-GB", "EN", "auto", "", None])
def test_source_codes(code: str | None) -> None:
    languages = ModelLanguages(EN_ZH)
    assert languages.resolve_source(code) == (None if code in ("auto", "", None) else "eng")


def test_unknown_codes_name_the_valid_ones() -> None:
    languages = ModelLanguages(EN_ZH)
    with pytest.raises(ValueError, match=r"unknown source language 'zh'; valid: auto, en \(eng\)$"):
        languages.resolve_source("zh")
    valid = "zh (cmn_Hans), zt (cmn_Hant), cjy-Hans, cjy-Hant, cmn, gan, lzh, lzh-Hans, nan, wuu, yue, yue-Hans"
    valid += ", yue-Hant"
    for code in ("fr", "pt-BR", "lzh-Hant", "Chinese", "xx"):
        with pytest.raises(ValueError, match=re.escape(f"unknown target language '{code}'; valid: {valid}") + "$"):
            languages.resolve_target(code)


def test_public_codes_are_iso_639_1_where_one_exists() -> None:
    languages = ModelLanguages(EN_ZH)
    assert languages.public["eng"] == "en"
    assert [languages.public[t] for t in languages.targets] == [
        "zh", "zt", "cjy-Hans", "cjy-Hant", "cmn", "gan", "lzh", "lzh-Hans", "nan", "wuu", "yue", "yue-Hans",
        "yue-Hant",
    ]  # fmt: skip
    # Every public code leads back to its model code.
    for code, public in languages.public.items():
        assert match(public, [languages.source, *languages.targets]) == code
    assert public_codes(["por", "por_BR", "fra"]) == {"por": "pt", "por_BR": "pb", "fra": "fr"}
    assert public_codes(["arb_Arab", "zsm_Latn"]) == {"arb_Arab": "ar", "zsm_Latn": "ms"}  # FLORES members


def test_fairseq_codes_with_territories_are_iso_codes_for_clients() -> None:
    """mBART-50's codes (`en_XX`, `zh_CN`, `ar_AR`): XX is no territory; a territory is shown and required only where
    the model has the language more than once."""
    from onnxmt.architectures.mbart import ML50_CODES

    tokens = {code: code for code in ML50_CODES}
    languages = ModelLanguages({"source_tokens": tokens, "target_tokens": tokens, "default_source": "en_XX"})
    assert [languages.public[c] for c in ("en_XX", "zh_CN", "ar_AR", "de_DE", "pt_XX", "sw_KE", "tl_XX")] == [
        "en", "zh", "ar", "de", "pt", "sw", "fil",
    ]  # fmt: skip
    for code, expected in [("zh", "zh_CN"), ("zh-Hans", "zh_CN"), ("zh-CN", "zh_CN"), ("en-US", "en_XX"),
                           ("de", "de_DE"), ("ar", "ar_AR"), ("pt-BR", "pt_XX"), ("fr", "fr_XX")]:  # fmt: skip
        assert languages.resolve_target(code) == expected, code
    for code in ("zt", "zh-TW", "de-AT", "ar-EG"):  # another script, another territory
        with pytest.raises(ValueError, match="unknown target language"):
            languages.resolve_target(code)
    for code, public in languages.public.items():
        assert match(public, ML50_CODES) == code
    # Two territories of one language: each shows and needs its own, a bare code is ambiguous.
    assert public_codes(["pt_BR", "pt_PT"]) == {"pt_BR": "pb", "pt_PT": "pt-PT"}
    assert match("pt", ["pt_BR", "pt_PT"]) is None and match("pt-PT", ["pt_BR", "pt_PT"]) == "pt_PT"
    assert public_codes(["pt_BR"]) == {"pt_BR": "pb"}  # LibreTranslate's code for it


def test_names_are_english() -> None:
    names = {code: display_name(code) for code in ("eng", "cmn_Hans", "cmn_Hant", "cmn", "yue", "yue_Hant", "zho")}
    assert names == {
        "eng": "English",
        "cmn_Hans": "Chinese (Simplified)",
        "cmn_Hant": "Chinese (Traditional)",
        "cmn": "Mandarin Chinese",
        "yue": "Cantonese",
        "yue_Hant": "Cantonese (Traditional)",
        "zho": "Chinese",
    }
    assert display_name("qqq_Xyzw") == "qqq_Xyzw"


def test_single_target_model() -> None:
    languages = ModelLanguages(SINGLE)
    assert languages.public == {"eng": "en", "zho": "zh"}
    for code in ("zh", "zho", "zh-Hans", "cmn_Hans", None):
        assert languages.resolve_target(code) is None
    with pytest.raises(ValueError, match=r"single target language \(zh \(zho\)\); target_lang 'zh-TW' cannot"):
        languages.resolve_target("zh-TW")


def test_default_target() -> None:
    assert ModelLanguages({**EN_ZH, "default_target": "yue_Hant"}).resolve_target(None) == "yue_Hant"
    assert ModelLanguages(EN_ZH).resolve_target(None) is None


def test_libretranslate_1_7_codes_beside_the_older_ones() -> None:
    # LibreTranslate >= 1.7 lists zh-Hans, zh-Hant and pt-BR where it listed zh, zt and pb (language.py aliases).
    languages = ModelLanguages(EN_ZH)
    assert languages.new_codes() == {"zh": "zh-Hans", "zt": "zh-Hant"}
    for old, new in languages.new_codes().items():  # the same model language either way
        assert languages.resolve_target(new) == languages.resolve_target(old)
    assert ModelLanguages(SINGLE).new_codes() == {"zh": "zh-Hans"}
    portuguese = {"source": "eng", "target": "por", "target_tokens": {"por": ">>por<<", "por_BR": ">>por_BR<<"}}
    assert ModelLanguages(portuguese).new_codes() == {"pb": "pt-BR"}
    # A new code that already is another model code's public code stays that code's: never one code for two.
    both = {"source": "eng", "target": "zho", "target_tokens": {c: f">>{c}<<" for c in ("cmn_Hans", "zho_Hans")}}
    assert ModelLanguages(both).public == {"eng": "en", "cmn_Hans": "zh", "zho_Hans": "zh-Hans"}
    assert ModelLanguages(both).new_codes() == {}
