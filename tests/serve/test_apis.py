"""What the DeepL, Google and OpenAI routes share (serve/apis.py, serve/errors.py): schemathesis finds no server
error on them and their answers match the OpenAPI they are described by; the instruction reader of chat prompts
(serve/prompts.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from onnxmt.serve.prompts import read_chat
from onnxmt.serve.protocol import ApiError
from tests.helpers.server import Server, server_fixture
from tests.helpers.skips import skip

server = server_fixture("tiny_multi_onnx_dir", log="apis", max_texts=8, max_body_bytes=20000)


def test_schemathesis_finds_no_server_error_on_the_apis(server: Server, tmp_path: Path) -> None:
    cli = shutil.which("schemathesis") or str(Path(sys.executable).parent / "schemathesis")
    if not Path(cli).exists():
        skip("needs schemathesis (pip install -e '.[dev]')")
    checks = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"
    command = [
        cli,
        "run",
        f"{server.url}/openapi.json",
        "--checks",
        checks,
        "--include-path-regex",
        "^/(v1|v2|language)/",
    ]
    command += ["--max-examples", "12", "--max-time", "25", "--seed", "47", "--no-color", "--request-timeout", "30"]
    out = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    report = out.stdout[-4000:]
    assert out.returncode == 0, report
    summary = re.search(r"(\d+) generated, (\d+) passed", report)
    assert summary and int(summary[1]) > 50 and summary[1] == summary[2], report


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v2/translate", '{"text": ["fine", "a\\ud800"], "target_lang": "ZH"}', "text"),
        ("/language/translate/v2", '{"q": "a\\udc00", "target": "zh"}', "q"),
        ("/v1/chat/completions", '{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}', "messages"),
    ],
)
def test_a_lone_surrogate_is_a_400_naming_the_field(server: Server, path: str, body: str, field: str) -> None:
    # Legal JSON, not text: refused before any tokenizer sees it, in each API's own error shape.
    answer = httpx.post(server.url + path, content=body, headers={"Content-Type": "application/json"}, timeout=30)
    assert answer.status_code == 400, answer.text
    assert f"{field} is not valid Unicode text (it holds a lone surrogate)" in answer.text


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def system(text: str) -> dict[str, str]:
    return {"role": "system", "content": text}


@pytest.mark.parametrize(
    ("messages", "source", "target", "text"),
    [
        ([user("Translate the following text from English to Chinese:\n\nHello world")], "en", "zh", "Hello world"),
        ([user("Translate into French: Hello world")], None, "fr", "Hello world"),
        ([user("Translate it into Italian: ciao")], None, "it", "ciao"),  # "it" is a pronoun, not Italian
        (
            [system("You are a translator. Translate English into Japanese."), user("Good morning")],
            "en",
            "ja",
            "Good morning",
        ),
        ([system("Translate into Chinese"), user("Translate me, please")], None, "zh", "Translate me, please"),
        (
            [
                system(
                    "You are a translation expert. Your only task is to translate text enclosed with <t> from "
                    "input language to Spanish"
                ),
                user("Hello"),
            ],
            None,
            "es",
            "Hello",
        ),
        (
            [
                user(
                    "Translate the following source text to Simplified Chinese, Output translation directly "
                    "without any additional text.\nSource Text: Hi there\nTranslated Text:"
                )
            ],
            None,
            "zh-Hans",
            "Hi there",
        ),
        ([user("将以下文本翻译为英语，注意只需要输出翻译后的结果，不要额外解释：\n\n你好")], None, "en", "你好"),
        ([user("Hello world\n\nTranslate the above text into German.")], None, "de", "Hello world"),
        ([user("Please translate to pt-BR:\n```\nHello\n```")], None, "pt-BR", "Hello"),
        (
            [user([{"type": "text", "source_lang_code": "en", "target_lang_code": "zh", "text": "Hi"}])],
            "en",
            "zh",
            "Hi",
        ),  # type: ignore[list-item]
        ([user("How are you going to do this?")], None, None, "How are you going to do this?"),
        ([user("Translate this to my liking: Hi")], None, None, "Translate this to my liking: Hi"),  # my: not Burmese
        (
            [user("Translate the following markdown source text to zh. Keep it.\nSource Text: A\nTranslated Text:")],
            None,
            "zh",
            "A",
        ),
        (  # the conversation so far: an assistant's content may be null (tool calls)
            [system("Translate into Korean"), user("One"), {"role": "assistant", "content": None}, user("Two")],
            None,
            "ko",
            "Two",
        ),
    ],
)
def test_the_prompts_translation_apps_send(
    messages: list[dict[str, str]], source: str | None, target: str | None, text: str
) -> None:
    ask = read_chat(messages)
    assert (ask.source, ask.target, ask.text) == (source, target, text)


@pytest.mark.parametrize(
    ("messages", "words"),
    [
        ("hi", "non-empty list"),
        ([{"content": "hi"}], "with a role"),
        ([system("Translate into French")], "no user message"),
        ([{"role": "user", "content": [{"type": "image_url"}]}], "text part"),
    ],
)
def test_chats_of_the_wrong_shape(messages: object, words: str) -> None:
    with pytest.raises(ApiError, match=words):
        read_chat(messages)
