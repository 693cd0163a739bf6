"""The `deepl` Python client, unmodified (`server_url`), against a real `onnxmt serve` on the multi-target tiny
model: the same translations `/translate` gives, DeepL's codes, its error statuses and shapes (serve/deepl.py)."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlencode

import httpx
import pytest

from tests.helpers.server import Server, server_fixture
from tests.helpers.skips import importorskip

deepl = importorskip("deepl")

KEY = "deepl-key"
TEXTS = ["Hello world", "The weather is nice today."]

server = server_fixture("tiny_multi_onnx_dir", log="deepl", api_keys=KEY, max_texts=4, max_body_bytes=20000)


@pytest.fixture(autouse=True)
def _no_retries(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The client retries 429 and 5xx for minutes by default: a test wants the first answer."""
    monkeypatch.setattr(deepl.http_client, "max_network_retries", 0)
    yield


def translator(server: Server, key: str = KEY) -> deepl.Translator:
    return deepl.Translator(key, server_url=server.url)


def libretranslate(server: Server, texts: list[str], target: str, source: str = "auto", fmt: str = "text") -> list[str]:
    """What `/translate` answers for `texts`."""
    body = {"q": texts, "source": source, "target": target, "api_key": KEY, "format": fmt}
    answer = httpx.post(f"{server.url}/translate", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    return list(answer.json()["translatedText"])


def test_translate_single_and_list_equal_translate(server: Server) -> None:
    api = translator(server)
    one = api.translate_text(TEXTS[0], target_lang="ZH-HANS")
    assert isinstance(one, deepl.TextResult)
    assert one.text == libretranslate(server, TEXTS[:1], "zh")[0]
    assert one.detected_source_lang == "EN" and one.billed_characters == len(TEXTS[0])
    many = api.translate_text(TEXTS, source_lang="EN", target_lang="ZH-HANT")
    assert [r.text for r in many] == libretranslate(server, TEXTS, "zt", "en")
    assert [r.text for r in many] != libretranslate(server, TEXTS, "zh", "en")  # the target reached the model
    assert [r.detected_source_lang for r in many] == ["EN", "EN"]


def test_html_tags_are_kept(server: Server) -> None:
    html = "<p>Hello <b>world</b></p>"
    result = translator(server).translate_text(html, target_lang="ZH", tag_handling="html")
    assert result.text == libretranslate(server, [html], "zh", fmt="html")[0]
    assert result.text.startswith("<p>") and "<b>" in result.text and result.text.endswith("</p>")


def test_languages_and_usage(server: Server) -> None:
    api = translator(server)
    assert [(lang.code, lang.name) for lang in api.get_source_languages()] == [("EN", "English")]
    targets = {lang.code: lang for lang in api.get_target_languages()}
    assert {"ZH", "ZH-HANS", "ZH-HANT"} <= set(targets) and "ZT" not in targets
    assert targets["ZH-HANT"].name == "Chinese (Traditional)" and targets["ZH"].supports_formality is False
    usage = api.get_usage()
    assert usage.character.valid and not usage.any_limit_reached
    assert usage.character.count >= 0


def test_wrong_key_is_an_authorization_error(server: Server) -> None:
    with pytest.raises(deepl.AuthorizationException):
        translator(server, "wrong").translate_text("Hello", target_lang="ZH")
    with pytest.raises(deepl.AuthorizationException):
        translator(server, "wrong").get_usage()
    answer = httpx.post(f"{server.url}/v2/translate", data={"text": "Hello", "target_lang": "ZH"})
    assert answer.status_code == 403 and set(answer.json()) == {"message"}


def test_glossaries_are_refused_cleanly(server: Server) -> None:
    api = translator(server)
    assert api.get_glossary_languages() == []
    assert api.list_glossaries() == []
    with pytest.raises(deepl.DeepLException, match="Glossaries are not supported") as refused:
        api.create_glossary("terms", "EN", "ZH", {"world": "世界"})
    assert refused.value.http_status_code == 400
    with pytest.raises(deepl.GlossaryNotFoundException):
        api.get_glossary("0c2b6e8e-0000-0000-0000-000000000000")
    with pytest.raises(deepl.DeepLException, match="Glossary not found"):
        api.translate_text("Hello", source_lang="EN", target_lang="ZH", glossary="0c2b6e8e")


def test_curl_shaped_forms(server: Server) -> None:
    """DeepL's documented curl: a form with `text` repeated, the key in the header; `type` in a GET's query."""
    headers = {"Authorization": f"DeepL-Auth-Key {KEY}"}
    form = urlencode([("text", TEXTS[0]), ("text", TEXTS[1]), ("target_lang", "ZH")])
    posted = {**headers, "Content-Type": "application/x-www-form-urlencoded"}
    answer = httpx.post(f"{server.url}/v2/translate", content=form, headers=posted)
    assert answer.status_code == 200, answer.text
    assert [t["text"] for t in answer.json()["translations"]] == libretranslate(server, TEXTS, "zh")
    one = httpx.post(f"{server.url}/v2/translate", data={"text": TEXTS[0], "target_lang": "zh"}, headers=headers)
    assert one.json()["translations"][0]["text"] == libretranslate(server, TEXTS[:1], "zh")[0]
    listed = httpx.get(f"{server.url}/v2/languages?type=target", headers=headers).json()
    assert {"language": "ZH-HANT", "name": "Chinese (Traditional)", "supports_formality": False} in listed
    legacy = httpx.post(f"{server.url}/v2/translate", data={"text": "Hi", "target_lang": "ZH", "auth_key": KEY})
    assert legacy.status_code == 200, legacy.text


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"text": 5, "target_lang": "ZH"}, 400, "text must be a string"),
        ({"text": ["a", None], "target_lang": "ZH"}, 400, "text[1] must be a string"),
        ({"text": ["a"] * 5, "target_lang": "ZH"}, 400, "Too many texts"),
        ({"text": "Hello"}, 400, "target_lang"),
        ({"text": "Hello", "target_lang": "FR"}, 400, "unknown target language"),
        ({"text": "Hello", "target_lang": ["ZH"]}, 400, "target_lang must be a string"),
        ({"text": "Hello", "target_lang": "ZH", "tag_handling": "markdown"}, 400, "tag_handling"),
        ({"text": "x" * 30000, "target_lang": "ZH"}, 413, "too large"),
    ],
)
def test_hostile_input_gets_deepl_errors(server: Server, body: dict[str, object], status: int, words: str) -> None:
    headers = {"Authorization": f"DeepL-Auth-Key {KEY}"}
    answer = httpx.post(f"{server.url}/v2/translate", json=body, headers=headers)
    assert answer.status_code == status, answer.text
    assert set(answer.json()) == {"message"} and words in answer.json()["message"]


def test_unknown_route_and_malformed_json_are_deepl_shaped(server: Server) -> None:
    headers = {"Authorization": f"DeepL-Auth-Key {KEY}", "Content-Type": "application/json"}
    answer = httpx.post(f"{server.url}/v2/translate", content=b"{not json", headers=headers)
    assert answer.status_code == 400 and "malformed JSON" in answer.json()["message"]
    assert set(httpx.get(f"{server.url}/v2/document", headers=headers).json()) == {"message"}


def test_weblate_shaped_request_keeps_its_placeholders(server: Server) -> None:
    """Weblate's DeepL backend (weblate/machinery/deepl.py): JSON with `ignore_tags` a list, `formality`, XML tag
    handling, and its placeholders as empty `<x id="N"></x>` elements, which must come back as they went."""
    headers = {"Authorization": f"DeepL-Auth-Key {KEY}"}
    assert (
        httpx.get(f"{server.url}/v2/languages", params={"type": "source"}, headers=headers).json()[0]["language"]
        == "EN"
    )
    texts = ['Hello <x id="6"></x> world', "The weather is nice today."]
    body = {
        "text": texts,
        "source_lang": "EN",
        "target_lang": "ZH-HANS",
        "formality": "default",
        "tag_handling": "xml",
        "ignore_tags": ["x"],
    }
    answer = httpx.post(f"{server.url}/v2/translate", json=body, headers=headers)
    assert answer.status_code == 200, answer.text
    translated = [t["text"] for t in answer.json()["translations"]]
    assert '<x id="6"></x>' in translated[0]
    assert translated == libretranslate(server, texts, "zh", "en", fmt="html")
