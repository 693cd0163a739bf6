"""`google-cloud-translate`'s `translate_v2.Client`, unmodified (`api_endpoint`, an API key), and
curl-shaped requests (`?key=`), against a real `onnxmt serve` on the multi-target tiny model: the translations
`/translate` gives, Google's codes and error shape (serve/google.py)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.helpers.server import Server, server_fixture
from tests.helpers.skips import importorskip

importorskip("google.cloud.translate_v2")

KEY = "google-key"
TEXTS = ["Hello world", "The weather is nice today."]
BASE = "/language/translate/v2"

server = server_fixture("tiny_multi_onnx_dir", log="google", api_keys=KEY, max_texts=4, max_body_bytes=20000)


def client(server: Server, key: str = KEY) -> Any:
    """The client as its docs set it up for an API key (translate_v2.Client passes no client_options.api_key on to
    google-cloud-core, so the key goes in as credentials, which send it as x-goog-api-key)."""
    from google.auth import api_key
    from google.cloud import translate_v2

    return translate_v2.Client(credentials=api_key.Credentials(key), client_options={"api_endpoint": server.url})


def libretranslate(server: Server, texts: list[str], target: str, source: str = "auto", fmt: str = "text") -> list[str]:
    body = {"q": texts, "source": source, "target": target, "api_key": KEY, "format": fmt}
    answer = httpx.post(f"{server.url}/translate", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    return list(answer.json()["translatedText"])


def test_translate_equals_translate(server: Server) -> None:
    api = client(server)
    one = api.translate(TEXTS[0], target_language="zh-CN")
    assert one["translatedText"] == libretranslate(server, TEXTS[:1], "zh")[0]
    assert one["detectedSourceLanguage"] == "en" and one["input"] == TEXTS[0]
    many = api.translate(TEXTS, target_language="zh-TW", source_language="en")
    assert [r["translatedText"] for r in many] == libretranslate(server, TEXTS, "zt", "en")
    assert [r["translatedText"] for r in many] != libretranslate(server, TEXTS, "zh", "en")
    assert "detectedSourceLanguage" not in many[0]
    html = api.translate("<p>Hello <b>world</b></p>", target_language="zh", format_="html")
    assert html["translatedText"] == libretranslate(server, ["<p>Hello <b>world</b></p>"], "zh", fmt="html")[0]


def test_languages_and_detect(server: Server) -> None:
    api = client(server)
    named = api.get_languages(target_language="en")
    assert {"language": "en", "name": "English"} in named
    assert {"language": "zh-TW", "name": "Chinese (Traditional)"} in named
    codes = [entry["language"] for entry in api.get_languages()]
    assert "zh-CN" in codes and "zt" not in codes and "zh-Hant" not in codes
    found = api.detect_language(["Hello, how are you today?", "The weather is nice."])
    assert [d["language"] for d in found] == ["en", "en"] and 0 < found[0]["confidence"] <= 1


def test_wrong_key_is_forbidden(server: Server) -> None:
    from google.api_core import exceptions

    with pytest.raises(exceptions.Forbidden, match="valid API key"):
        client(server, "wrong").translate("Hello", target_language="zh")
    answer = httpx.post(f"{server.url}{BASE}", json={"q": "Hello", "target": "zh"})
    assert answer.status_code == 403
    assert answer.json()["error"]["status"] == "PERMISSION_DENIED" and answer.json()["error"]["code"] == 403


def test_curl_with_key_in_the_query(server: Server) -> None:
    """Google's documented curl: fields and key in the query string (GET or POST), or a form with `q` repeated."""
    url = f"{server.url}{BASE}"
    got = httpx.get(url, params=[("key", KEY), ("q", TEXTS[0]), ("q", TEXTS[1]), ("target", "zh")])
    assert got.status_code == 200, got.text
    assert [t["translatedText"] for t in got.json()["data"]["translations"]] == libretranslate(server, TEXTS, "zh")
    posted = httpx.post(url, params={"key": KEY}, data={"q": TEXTS[0], "target": "zh", "source": "en"})
    assert posted.json()["data"]["translations"] == [{"translatedText": libretranslate(server, TEXTS[:1], "zh")[0]}]
    headers = {"x-goog-api-key": KEY}
    languages = httpx.get(f"{url}/languages", headers=headers).json()["data"]["languages"]
    assert {"language": "en"} in languages
    assert httpx.get(url, params={"key": "wrong", "q": "Hi", "target": "zh"}).status_code == 403


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"q": 5, "target": "zh"}, 400, "q must be a string"),
        ({"q": ["a"] * 5, "target": "zh"}, 400, "Too many texts"),
        ({"q": "Hello"}, 400, "target"),
        ({"q": "Hello", "target": "fr"}, 400, "unknown target language"),
        ({"q": "Hello", "target": "zh", "format": "pdf"}, 400, "format"),
        ({"q": "x" * 30000, "target": "zh"}, 413, "too large"),
    ],
)
def test_hostile_input_gets_google_errors(server: Server, body: dict[str, object], status: int, words: str) -> None:
    answer = httpx.post(f"{server.url}{BASE}", json=body, headers={"x-goog-api-key": KEY})
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["code"] == status and words in error["message"] and error["status"]


def test_client_reads_google_errors(server: Server) -> None:
    """google-api-core reads `error.message`: LibreTranslate's `{"error": "..."}` made it fail on `.get`."""
    from google.api_core import exceptions

    with pytest.raises(exceptions.BadRequest, match="unknown target language"):
        client(server).translate("Hello", target_language="fr")
