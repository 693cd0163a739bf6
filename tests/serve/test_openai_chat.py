"""The `openai` client, unmodified (`base_url`), against a real `onnxmt serve` on the multi-target tiny model:
models, chat completions whose content is the translation `/translate` gives, streamed or not, languages from a
field, a system message or the prompts translation apps send (serve/openai_chat.py, serve/prompts.py)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.helpers.server import Server, server_fixture
from tests.helpers.skips import importorskip

openai = importorskip("openai")

KEY = "openai-key"
TEXTS = ["Hello world", "The weather is nice today."]

server = server_fixture("tiny_multi_onnx_dir", log="openai", api_keys=KEY, max_body_bytes=20000)


def client(server: Server, key: str = KEY) -> Any:
    return openai.OpenAI(api_key=key, base_url=f"{server.url}/v1", max_retries=0)


def libretranslate(
    server: Server, texts: list[str], target: str | None, source: str = "auto", beams: int | None = None
) -> list[str]:
    body = {"q": texts, "source": source, "target": target, "api_key": KEY, "beams": beams}
    answer = httpx.post(f"{server.url}/translate", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    return list(answer.json()["translatedText"])


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def system(text: str) -> dict[str, str]:
    return {"role": "system", "content": text}


def complete(server: Server, messages: list[dict[str, str]], **extra: Any) -> str:
    answer = client(server).chat.completions.create(model="onnxmt/model", messages=messages, **extra)
    assert answer.choices[0].finish_reason == "stop" and answer.model == "onnxmt/model"
    return str(answer.choices[0].message.content)


def test_models(server: Server, tiny_multi_onnx_dir: Any) -> None:
    models = client(server).models.list()
    assert [m.id for m in models.data] == [f"onnxmt/{tiny_multi_onnx_dir.name}"]
    assert client(server).models.retrieve(models.data[0].id).id == models.data[0].id
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client(server).models.retrieve("gpt-4o")


def test_a_target_field_gives_the_translation_of_translate(server: Server) -> None:
    zh, zt = libretranslate(server, TEXTS[:1], "zh")[0], libretranslate(server, TEXTS[:1], "zt")[0]
    assert zh != zt
    assert complete(server, [user(TEXTS[0])], extra_body={"target": "zh"}) == zh
    assert complete(server, [user(TEXTS[0])], extra_body={"target": "zh-Hant", "source": "en"}) == zt


@pytest.mark.parametrize(
    ("messages", "target"),
    [
        ([system("Translate into Chinese."), user(TEXTS[1])], "zh"),
        ([system("You are a translator. Translate English into Traditional Chinese."), user(TEXTS[1])], "zt"),
        ([user(f"Translate the following text from English to Chinese:\n\n{TEXTS[1]}")], "zh"),
        (  # Immersive Translate's and PDFMathTranslate's shape
            [
                system("You are a professional, authentic machine translation engine."),
                user(
                    "Translate the following source text to zh-TW, Output translation directly without any "
                    f"additional text.\nSource Text: {TEXTS[1]}\nTranslated Text:"
                ),
            ],
            "zt",
        ),
        ([user(f"将以下文本翻译为繁体中文，注意只需要输出翻译后的结果，不要额外解释：\n\n{TEXTS[1]}")], "zt"),
        ([user(f"Translate the following segment into Chinese, without additional explanation.\n\n{TEXTS[1]}")], "zh"),
    ],
)
def test_prompts_of_translation_apps(server: Server, messages: list[dict[str, str]], target: str) -> None:
    assert complete(server, messages) == libretranslate(server, TEXTS[1:], target)[0]


def test_lines_are_translated_each_and_kept_apart(server: Server) -> None:
    text = f"{TEXTS[0]}\n\n{TEXTS[1]}"
    expected = libretranslate(server, TEXTS, "zh")
    assert complete(server, [user(text)], extra_body={"target": "zh"}) == f"{expected[0]}\n\n{expected[1]}"
    # Lines without a letter are separators apps put between paragraphs: kept as they are.
    marked = f"{TEXTS[0]}\n%%\n{TEXTS[1]}\n\n---"
    assert complete(server, [user(marked)], extra_body={"target": "zh"}) == f"{expected[0]}\n%%\n{expected[1]}\n\n---"


def test_stream_joins_into_the_completion(server: Server) -> None:
    """Streamed or not, the same content; with greedy search (`beams` 1, onnxmt's field) token by token, with the
    model's beams in one piece at the end. Texts not translated before: one in the translation cache comes whole."""
    for text, beams, least in (
        ("It rains in Paris tonight.", 1, 4),
        ("\nGood morning, dear friends.\nSee you soon.", 1, 4),
        ("It snows in Oslo today.", None, 1),
    ):
        messages = [system("Translate into Chinese"), user(text)]
        extra = {"extra_body": {"beams": beams}} if beams else {}
        stream = client(server).chat.completions.create(model="onnxmt/model", messages=messages, stream=True, **extra)
        chunks = list(stream)
        whole = complete(server, messages, **extra)
        pieces = [c.choices[0].delta.content for c in chunks if c.choices[0].delta.content]
        assert "".join(pieces) == whole
        assert len(pieces) >= least
        assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].choices[0].finish_reason == "stop"
    assert (
        complete(server, [user(TEXTS[0])], extra_body={"target": "zh", "beams": 1})
        == libretranslate(server, TEXTS[:1], "zh", beams=1)[0]
    )


def test_wrong_key_is_an_authentication_error(server: Server) -> None:
    with pytest.raises(openai.AuthenticationError):
        client(server, "wrong").chat.completions.create(model="m", messages=[user("Hi")])
    with pytest.raises(openai.AuthenticationError):
        client(server, "wrong").models.list()


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"messages": "Hello"}, 400, "messages must be a non-empty list"),
        ({"messages": []}, 400, "messages must be a non-empty list"),
        ({"messages": [{"role": "system", "content": "Translate into Chinese"}]}, 400, "no user message"),
        ({"messages": [{"role": "user", "content": 5}]}, 400, "content must be a string"),
        ({"messages": [{"role": "user", "content": "Hi"}], "stream": "yes"}, 400, "stream must be a boolean"),
        ({"messages": [{"role": "user", "content": "Hi"}], "n": 2}, 400, "n must be 1"),
        ({"messages": [{"role": "user", "content": "Hi"}], "target": "fr"}, 400, "unknown target language"),
        ({"messages": [{"role": "user", "content": "x" * 30000}]}, 413, "too large"),
    ],
)
def test_hostile_input_gets_openai_errors(server: Server, body: dict[str, object], status: int, words: str) -> None:
    answer = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"})
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert words in error["message"] and error["type"]


def test_client_raises_bad_request_with_the_message(server: Server) -> None:
    with pytest.raises(openai.BadRequestError, match="unknown target language"):
        complete(server, [user("Hi")], extra_body={"target": "fr"})
