"""The HTTP calls of real LibreTranslate integrations, replayed from their own source code against real `onnxmt
serve` processes: each replay sends what the integration sends (method, path, content type, field names, the
values it fills in when it has none) and reads from the answer what the integration reads, failing where the
integration would. The source file each replay follows is named above it. The published client packages
(libretranslatepy, deep-translator, the npm `libretranslate`) run unmodified in test_protocol_clients.py.

The servers hold the tiny models of conftest.py: en→zh with opus-mt-en-zh's 13 language tokens (so Simplified and
Traditional Chinese are two different tokens, whose translations differ), and zh→en."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from onnxmt import Translator
from onnxmt.documents import translate_file, translate_string
from onnxmt.documents.files import FORMATS
from tests.helpers.server import Server, assert_error, server_fixture

TEXTS = ["Hello world", "The weather is nice today."]
CHINESE = "他和三个朋友从城里来。"
KEY = "integration-key"
TIMEOUT = 120


# en→zh and zh→en in one service, no keys: a Mastodon or Discourse instance's translation server.
server = server_fixture("tiny_multi_onnx_dir", "tiny_zh_en_onnx_dir", log="integrations")
# `onnxmt serve opus-mt-en-zh-onnx --api-keys KEY`: one model, /translate behind a key.
keyed = server_fixture("tiny_multi_onnx_dir", log="integrations-keyed", api_keys=KEY)


@pytest.fixture(scope="module")
def en_zh(tiny_multi_onnx_dir: Path) -> Translator:
    return Translator(tiny_multi_onnx_dir)


@pytest.fixture(scope="module")
def zh_en(tiny_zh_en_onnx_dir: Path) -> Translator:
    return Translator(tiny_zh_en_onnx_dir)


def library(translator: Translator, texts: list[str], target: str | None = None, html: bool = False) -> list[str]:
    """What the library gives for `texts`: the answer every replay must get."""
    if html:
        return [translate_string(translator, text, "html", target_lang=target) for text in texts]
    return [t.text for t in translator.translate(texts, target_lang=target)]


def ok(response: httpx.Response) -> Any:
    assert response.status_code == 200, response.text
    return response.json()


def test_the_two_chinese_scripts_are_two_translations(en_zh: Translator) -> None:
    # What the Traditional Chinese replays below rely on: the tiny model's two tokens translate differently.
    assert library(en_zh, TEXTS, "zt") != library(en_zh, TEXTS, "zh")


# --- Mastodon -----------------------------------------------------------------------------------------------------
# mastodon/mastodon, app/lib/translation_service/libre_translate.rb (TranslationService::LibreTranslate):
# `languages` GETs /languages (with a Content-Type: application/json header and no body) into a hash of each code to
# its targets without itself, plus nil => every target; TranslateStatusService#permitted? offers a translation only
# when languages[status.language] includes the reader's locale. `translate` POSTs JSON {q: [texts], source:
# status.language or "auto", target, format: "html", api_key: nil when unset}, reads translatedText[i] and
# detectedLanguage[i].language (the status language without it), and raises on any status but 2xx.


def mastodon_languages(server: Server) -> dict[str | None, list[str]]:
    response = httpx.get(f"{server.url}/languages", headers={"Content-Type": "application/json"}, timeout=TIMEOUT)
    languages: dict[str | None, list[str]] = {
        e["code"]: [t for t in e["targets"] if t != e["code"]] for e in ok(response)
    }
    languages[None] = sorted({t for targets in languages.values() for t in targets})
    return languages


def mastodon_translate(server: Server, texts: list[str], source: str | None, target: str) -> list[tuple[str, str]]:
    body = json.dumps({"q": texts, "source": source or "auto", "target": target, "format": "html", "api_key": None})
    headers = {"Content-Type": "application/json"}
    data = ok(httpx.post(f"{server.url}/translate", content=body, headers=headers, timeout=TIMEOUT))
    assert isinstance(data, dict)
    detected = data.get("detectedLanguage") or []
    return [
        (text, (detected[i] if i < len(detected) else {}).get("language") or source)
        for i, text in enumerate(data["translatedText"])
    ]


def test_mastodon(server: Server, en_zh: Translator, zh_en: Translator) -> None:
    languages = mastodon_languages(server)
    # A status in Chinese, an English-speaking reader (Mastodon's locale `en`).
    assert "en" in languages["zh"]
    status = [f"<p>{CHINESE}</p>"]
    assert mastodon_translate(server, status, "zh", "en") == [(library(zh_en, status, html=True)[0], "zh")]
    # A status in English, read into a language the server lists; one without a language is detected.
    assert "zh" in languages["en"] and "zh-Hant" in languages["en"]
    statuses = [f"<p>{text}</p>" for text in TEXTS]
    expected = library(en_zh, statuses, "zh", html=True)
    assert mastodon_translate(server, statuses, "en", "zh") == [(text, "en") for text in expected]
    assert mastodon_translate(server, statuses, None, "zh") == [(text, "en") for text in expected]


# --- Weblate --------------------------------------------------------------------------------------------------------
# WeblateOrg/weblate, weblate/machinery/libretranslate.py (LibreTranslateTranslation) on weblate/machinery/base.py
# (BatchMachineTranslation): download_languages() GETs /languages and keeps each entry's "code"; get_languages()
# tries, for the project's language, its code through language_map and then the code cut at each "_"
# (get_language_possibilities), taking the first that is_supported() finds among those codes, source and target
# alike; download_multiple_translations() POSTs JSON {api_key: the key setting ("" when none), q: [texts], source,
# target} and reads translatedText[i]. Requests carry Referer and Accept: application/json; charset=utf-8.
# language_map sends zh_Hans and zh_Hant as LibreTranslate 1.7's zh-Hans and zh-Hant (its tests' test_chinese
# serves both from a /languages that lists only those; WeblateOrg/weblate#15967), so a zh_Hant project tries
# zh-Hant, then zh. Its settings check (validate_settings: "test" from en into de) needs an en→de server: not here.
WEBLATE_LANGUAGE_MAP = {"zh_Hans": "zh-Hans", "zh_Hant": "zh-Hant"}
WEBLATE_HEADERS = {"Referer": "https://weblate.example/", "Accept": "application/json; charset=utf-8"}


def weblate_possibilities(code: str, language_map: dict[str, str]) -> Iterator[str]:
    yield language_map.get(code, code)
    code = code.replace("-", "_")
    while "_" in code:
        code = code.rsplit("_", 1)[0]
        yield language_map.get(code, code)


def weblate_languages(server: Server, source: str, target: str, language_map: dict[str, str]) -> tuple[str, str]:
    response = httpx.get(f"{server.url}/languages", headers=WEBLATE_HEADERS, timeout=TIMEOUT)
    supported = {entry["code"] for entry in ok(response)}
    for s in weblate_possibilities(source, language_map):
        for t in weblate_possibilities(target, language_map):
            if s in supported and t in supported and s != t:
                return s, t
    raise AssertionError(f"Weblate: not supported: {source} - {target}")


def weblate_translate(server: Server, source: str, target: str, texts: list[str]) -> list[str]:
    body = {"api_key": "", "q": texts, "source": source, "target": target}
    payload = ok(httpx.post(f"{server.url}/translate", json=body, headers=WEBLATE_HEADERS, timeout=TIMEOUT))
    return [payload["translatedText"][i] for i in range(len(texts))]


def test_weblate_traditional_chinese_project_gets_traditional_chinese(server: Server, en_zh: Translator) -> None:
    assert weblate_languages(server, "en", "zh_Hant", WEBLATE_LANGUAGE_MAP) == ("en", "zh-Hant")
    assert weblate_translate(server, "en", "zh-Hant", TEXTS) == library(en_zh, TEXTS, "zt")
    assert weblate_languages(server, "en", "zh_Hans", WEBLATE_LANGUAGE_MAP) == ("en", "zh-Hans")
    assert weblate_translate(server, "en", "zh-Hans", TEXTS) == library(en_zh, TEXTS, "zh")
    # Weblate before its map knew LibreTranslate 1.7's codes (language_map {"zh_Hans": "zh"}) still finds zh.
    assert weblate_languages(server, "en_US", "zh_Hans", {"zh_Hans": "zh"}) == ("en", "zh")
    # A Chinese source project into English, through the other model.
    assert weblate_languages(server, "zh_Hans", "en", WEBLATE_LANGUAGE_MAP) == ("zh-Hans", "en")


# --- Discourse ------------------------------------------------------------------------------------------------------
# discourse/discourse-translator, app/services/discourse_translator/provider/libre_translate.rb: detect! POSTs a
# urlencoded form {q: the post's text, api_key} to /detect (Ruby's URI.encode_www_form writes an unset key as a bare
# `api_key`) and takes [0].language; translate_supported? maps the reader's locale through SUPPORTED_LANG_MAPPING
# (zh_CN and zh_TW both to "zh") and GETs /languages, needing both codes among its entries; send_for_translation
# POSTs the same kind of form {q: the cooked HTML, source: the detected language, target, format: "html", api_key}
# and reads translatedText. Any status but 200 raises.
DISCOURSE_FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def discourse_post(server: Server, path: str, fields: list[tuple[str, str]]) -> Any:
    body = "&".join(f"{httpx.QueryParams({k: v})}" for k, v in fields) + "&api_key"  # encode_www_form(api_key: nil)
    return ok(httpx.post(f"{server.url}{path}", content=body, headers=DISCOURSE_FORM, timeout=TIMEOUT))


def test_discourse(server: Server, en_zh: Translator) -> None:
    detected = discourse_post(server, "/detect", [("q", TEXTS[1])])[0]["language"]
    assert detected == "en"
    codes = {entry["code"] for entry in ok(httpx.get(f"{server.url}/languages", timeout=TIMEOUT))}
    assert detected in codes and "zh" in codes  # a zh_CN or zh_TW reader: Discourse asks for "zh"
    cooked = f"<p>{TEXTS[1]}</p>"
    fields = [("q", cooked), ("source", detected), ("target", "zh"), ("format", "html")]
    assert discourse_post(server, "/translate", fields)["translatedText"] == library(en_zh, [cooked], "zh", True)[0]


# --- Akkoma ---------------------------------------------------------------------------------------------------------
# AkkomaGang/akkoma, lib/pleroma/akkoma/translators/libre_translate.ex: `languages` GETs /languages and needs "code"
# and "name" in every entry (its pattern match fails otherwise), offering them as sources and targets alike;
# `translate` POSTs JSON {q: the text, source: the language or "auto", target, format: "html", api_key: nil when
# unset} with content-type application/json and reads translatedText, and detectedLanguage.language when the
# answer has detectedLanguage.


def akkoma_translate(server: Server, text: str, source: str | None, target: str) -> tuple[str, str]:
    body = {"q": text, "source": source or "auto", "target": target, "format": "html", "api_key": None}
    answer = ok(httpx.post(f"{server.url}/translate", json=body, timeout=TIMEOUT))
    detected = answer["detectedLanguage"]["language"] if "detectedLanguage" in answer else source or ""
    return detected, answer["translatedText"]


def test_akkoma(server: Server, en_zh: Translator) -> None:
    listed = ok(httpx.get(f"{server.url}/languages", timeout=TIMEOUT))
    offered = [{"code": entry["code"], "name": entry["name"]} for entry in listed]
    assert {"code": "zh-Hant", "name": "Chinese (Traditional)"} in offered
    text = f"<p>{TEXTS[0]}</p>"
    assert akkoma_translate(server, text, None, "zh-Hant") == ("en", library(en_zh, [text], "zt", html=True)[0])
    assert akkoma_translate(server, text, "en", "zh") == ("en", library(en_zh, [text], "zh", html=True)[0])


# --- Nextcloud ------------------------------------------------------------------------------------------------------
# Nextcloud's integration_libretranslate app (v1r0x/integration_libretranslate, lib/LibretranslateProvider.php) on
# the jefs42/libretranslate PHP client (src/LibreTranslate.php), whose every request is curl with CURLOPT_POSTFIELDS
# (an empty array unless there are fields: an empty urlencoded body) and CURLOPT_CUSTOMREQUEST. The constructor
# POSTs / (its "connection test", answer ignored), GETs /frontend/settings and /languages (code => name), and
# refuses a configured source or target (from_lang, to_lang) that is not among the codes; Detect POSTs to
# /detect?q=...&api_key= (http_build_query; the key is "" when none is set) and reads [0].language; Translate POSTs a
# multipart form {q, format: "html", source, target, api_key} and reads translatedText (error: its `error`).
NEXTCLOUD_EMPTY = {"Content-Type": "application/x-www-form-urlencoded"}


def nextcloud_request(server: Server, method: str, endpoint: str) -> Any:
    url = f"{server.url}{endpoint}"
    response = httpx.request(method, url, content=b"", headers=NEXTCLOUD_EMPTY, timeout=TIMEOUT)
    assert response.status_code < 500, response.text
    return response.json()  # json_decode


def test_nextcloud(server: Server, en_zh: Translator) -> None:
    nextcloud_request(server, "POST", "/")
    settings = nextcloud_request(server, "GET", "/frontend/settings")
    assert settings["charLimit"] == 5000
    languages = {entry["code"]: entry["name"] for entry in nextcloud_request(server, "GET", "/languages")}
    assert "en" in languages and "zh-Hant" in languages  # from_lang en, to_lang zh-Hant: both accepted
    query = httpx.QueryParams({"q": TEXTS[1], "api_key": ""})
    assert nextcloud_request(server, "POST", f"/detect?{query}")[0]["language"] == "en"
    fields = {"q": TEXTS[1], "format": "html", "source": "en", "target": "zh-Hant", "api_key": ""}
    parts = {name: (None, value) for name, value in fields.items()}
    answer = ok(httpx.post(f"{server.url}/translate", files=parts, timeout=TIMEOUT))
    assert answer["translatedText"] == library(en_zh, [TEXTS[1]], "zt", html=True)[0]


# --- the npm `libretranslate` client --------------------------------------------------------------------------------
# libretranslate 1.0.1 (npm), src/translate.ts: GETs /languages (Content-Type: application/json) and throws unless
# source and target are among the entries' codes (or "auto"); then POSTs JSON {q, source, target, format: "text",
# apiKey: the key or ""} and returns translatedText. The package itself runs in test_protocol_clients.py.


def npm_translate(server: Server, query: str, source: str, target: str, api_key: str | None = None) -> Any:
    headers = {"Content-Type": "application/json"}
    codes = ["auto"] + [e["code"] for e in ok(httpx.get(f"{server.url}/languages", headers=headers, timeout=TIMEOUT))]
    assert source in codes and target in codes, "This language was not found/does not exist."
    body = {"q": query, "source": source, "target": target, "format": "text", "apiKey": api_key or ""}
    return httpx.post(f"{server.url}/translate", json=body, headers=headers, timeout=TIMEOUT).json()["translatedText"]


def test_npm_client_key_is_read_as_api_key(keyed: Server, en_zh: Translator) -> None:
    assert npm_translate(keyed, TEXTS[0], "en", "zh", api_key=KEY) == library(en_zh, TEXTS[:1], "zh")[0]
    assert npm_translate(keyed, TEXTS[0], "auto", "zh-Hant", api_key=KEY) == library(en_zh, TEXTS[:1], "zt")[0]
    # Without a key it sends apiKey "": refused as a missing key.
    body = {"q": TEXTS[0], "source": "en", "target": "zh", "format": "text", "apiKey": ""}
    assert "needs an api_key" in assert_error(httpx.post(f"{keyed.url}/translate", json=body, timeout=TIMEOUT), 403)


@pytest.mark.parametrize("where", ["json", "form", "multipart", "query"])
def test_apikey_is_api_key_in_every_form(keyed: Server, en_zh: Translator, where: str) -> None:
    fields = {"q": TEXTS[0], "target": "zh", "apiKey": KEY}
    kwargs: dict[str, Any] = {
        "json": {"json": fields},
        "form": {"data": fields},
        "multipart": {"files": {name: (None, value) for name, value in fields.items()}},
        "query": {"params": fields},
    }[where]
    translated = ok(httpx.post(f"{keyed.url}/translate", timeout=TIMEOUT, **kwargs))
    assert translated["translatedText"] == library(en_zh, TEXTS[:1], "zh")[0]  # no source: detected as well
    detected = ok(httpx.post(f"{keyed.url}/detect", timeout=TIMEOUT, **kwargs))
    assert detected[0]["language"] == "en"
    wrong = {"json": {"json": {**fields, "apiKey": "wrong"}}, "query": {"params": {**fields, "apiKey": "wrong"}}}
    if where in wrong:
        assert_error(httpx.post(f"{keyed.url}/translate", timeout=TIMEOUT, **wrong[where]), 403)
    # api_key, when given, is the key; apiKey only stands in for it.
    both = {"json": {**fields, "api_key": KEY, "apiKey": "wrong"}}
    assert ok(httpx.post(f"{keyed.url}/translate", timeout=TIMEOUT, **both)) == translated
    assert_error(httpx.post(f"{keyed.url}/translate", json={**fields, "apiKey": 5}, timeout=TIMEOUT), 403)


# --- LibreTranslate's own web UI ------------------------------------------------------------------------------------
# LibreTranslate/LibreTranslate, libretranslate/templates/app.js.template (the page's Vue app): on load it GETs
# /frontend/settings and /languages together and shows "Cannot load /frontend/settings" on any status from 400 up;
# it starts from settings.language.source.code and .target.code and reads charLimit, suggestions,
# supportedFilesFormat, filesTranslation and frontendTimeout; it adds {code: "auto", targets: every code} to the
# languages and shows a source's targets by looking each code up among the languages (and sorting them by name, which
# throws on a code it does not find). Translating POSTs a multipart FormData {q, source, target, format: "html" when
# the text looks like markup else "text", alternatives: 3, api_key: the stored key or "", secret} and reads
# translatedText, and with source "auto" detectedLanguage.language and .confidence; a file POSTs FormData {file,
# source, target, api_key} to /translate_file and downloads translatedFileUrl; a suggestion POSTs FormData {q, s,
# source, target, api_key} to /suggest and shows res.error unless res.success. It never calls /detect.


def web_ui_load(server: Server) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    settings = ok(httpx.get(f"{server.url}/frontend/settings", timeout=TIMEOUT))
    langs = ok(httpx.get(f"{server.url}/languages", timeout=TIMEOUT))
    assert langs, "No languages available. Did you install the models correctly?"
    langs.append({"name": "Auto Detect", "code": "auto", "targets": [entry["code"] for entry in langs]})
    codes = [entry["code"] for entry in langs]
    assert len(codes) == len(set(codes))  # the page keys its options by code
    for entry in langs:  # targetLangs: every target of every source is a language of its own
        assert all(target in codes for target in entry["targets"]), entry
    return settings, langs


def web_ui_translate(server: Server, text: str, source: str, target: str, api_key: str = "") -> dict[str, Any]:
    form = {"q": text, "source": source, "target": target, "format": "html" if "<" in text else "text"}
    form.update({"alternatives": "3", "api_key": api_key, "secret": "bogus"})
    parts = {name: (None, value) for name, value in form.items()}
    return ok(httpx.post(f"{server.url}/translate", files=parts, timeout=TIMEOUT))


def test_web_ui_loads_translates_and_translates_files(server: Server, en_zh: Translator, tmp_path: Path) -> None:
    settings, langs = web_ui_load(server)
    assert settings["suggestions"] is False and settings["filesTranslation"] is True
    assert settings["supportedFilesFormat"] == list(FORMATS) and settings["frontendTimeout"] > 0
    assert settings["charLimit"] == 5000 and settings["apiKeys"] is False and settings["keyRequired"] is False
    # Two source languages: it starts from Auto Detect, into the first target there is.
    assert settings["language"] == {
        "source": {"code": "auto", "name": "Auto Detect"},
        "target": {"code": "zh", "name": "Chinese (Simplified)"},
    }
    source, target = settings["language"]["source"]["code"], settings["language"]["target"]["code"]
    assert any(entry["code"] == target for entry in langs)
    answer = web_ui_translate(server, TEXTS[1], source, target)
    assert isinstance(answer["translatedText"], str) and len(answer["alternatives"]) == 3
    detected = answer["detectedLanguage"]
    assert detected["language"] in [entry["code"] for entry in langs] and 0 < detected["confidence"] <= 100
    # Into zh-Hant: what zt gives (alternatives widen the beam, so the library's default is not the reference).
    answer = web_ui_translate(server, TEXTS[1], "en", "zh-Hant")
    body = {"q": TEXTS[1], "source": "en", "target": "zt", "alternatives": 3}
    assert answer == ok(httpx.post(f"{server.url}/translate", json=body, timeout=TIMEOUT))
    # A file, then its download.
    (tmp_path / "notes.txt").write_text(f"{TEXTS[0]}.\n{TEXTS[1]}\n", encoding="utf-8")
    upload = {"file": ("notes.txt", (tmp_path / "notes.txt").read_bytes())}
    fields = {"source": "en", "target": "zh-Hant", "api_key": ""}
    url = ok(httpx.post(f"{server.url}/translate_file", files=upload, data=fields, timeout=TIMEOUT))[
        "translatedFileUrl"
    ]
    translate_file(en_zh, tmp_path / "notes.txt", tmp_path / "out.txt", target_lang="zt")
    download = httpx.get(url, timeout=TIMEOUT)
    assert download.status_code == 200 and download.content == (tmp_path / "out.txt").read_bytes()
    # Suggestions are off (settings.suggestions): the answer LibreTranslate gives then.
    suggestion = {"q": TEXTS[0], "s": "你好", "source": "en", "target": "zh", "api_key": ""}
    parts = {name: (None, value) for name, value in suggestion.items()}
    response = httpx.post(f"{server.url}/suggest", files=parts, timeout=TIMEOUT)
    assert response.status_code == 403 and response.json() == {"error": "Suggestions are disabled on this server."}


def test_web_ui_against_one_model_with_keys(keyed: Server, en_zh: Translator) -> None:
    settings, _ = web_ui_load(keyed)  # /frontend/settings and /languages need no key without --protect-all
    assert settings["apiKeys"] is True and settings["keyRequired"] is True
    # One source language: the page starts from it (with "auto" it would offer English as a target too).
    assert settings["language"] == {
        "source": {"code": "en", "name": "English"},
        "target": {"code": "zh", "name": "Chinese (Simplified)"},
    }
    assert_error(httpx.post(f"{keyed.url}/translate", files={"q": (None, TEXTS[0]), "api_key": (None, "")}), 403)
    answer = web_ui_translate(keyed, TEXTS[0], "en", "zh", api_key=KEY)
    assert isinstance(answer["translatedText"], str) and "detectedLanguage" not in answer


def test_frontend_settings_and_suggest_are_in_the_schema(server: Server) -> None:
    paths = ok(httpx.get(f"{server.url}/openapi.json", timeout=TIMEOUT))["paths"]
    settings = paths["/frontend/settings"]["get"]
    assert settings["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/FrontendSettings"
    }
    suggest = paths["/suggest"]["post"]
    assert "403" in suggest["responses"] and "multipart/form-data" in suggest["requestBody"]["content"]
