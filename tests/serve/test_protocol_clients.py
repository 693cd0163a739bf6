"""The LibreTranslate clients people use, unmodified, against a real `onnxmt serve` process on the multi-target
tiny model (opus-mt-en-zh's metadata: `eng` → `zho`, 13 language tokens), with ISO 639-1 codes: they get the
translations `onnxmt translate` gives with the same options."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.helpers.node import run_node
from tests.helpers.server import ONNXMT, Server, server_fixture

TEXTS = ["Hello world", "The weather is nice today."]
KEY = "client-key"


server = server_fixture("tiny_multi_onnx_dir", log="clients")
keyed = server_fixture("tiny_multi_onnx_dir", log="clients-keyed", api_keys=KEY)


def cli_translations(model_dir: Path, target: str, texts: list[str]) -> list[str]:
    """What `onnxmt translate --target-lang TARGET` writes for `texts` (no torch either)."""
    command = [*ONNXMT, "translate", "-m", str(model_dir), "--target-lang", target, *texts]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=True)
    return done.stdout.splitlines()


@pytest.fixture(scope="module")
def expected(tiny_multi_onnx_dir: Path) -> dict[str, list[str]]:
    return {target: cli_translations(tiny_multi_onnx_dir, target, TEXTS) for target in ("zh", "zt")}


def test_libretranslatepy(server: Server, expected: dict[str, list[str]]) -> None:
    from libretranslatepy import LibreTranslateAPI

    api = LibreTranslateAPI(server.url)
    assert [api.translate(text, "en", "zh") for text in TEXTS] == expected["zh"]
    assert api.translate(TEXTS[0], "auto", "zh") == expected["zh"][0]
    assert api.translate(TEXTS[1], "en", "zt") == expected["zt"][1]
    assert expected["zh"] != expected["zt"]  # the language token reached the model
    detected = api.detect("Hello")
    assert detected[0]["language"] == "en" and 0 < detected[0]["confidence"] <= 100
    languages = api.languages()
    assert languages[0]["code"] == "en" and languages[0]["name"] == "English"
    assert {"zh", "zt", "zh-Hans", "zh-Hant"} <= set(languages[0]["targets"])
    assert {"code": "zh", "name": "Chinese (Simplified)", "targets": []} in languages
    assert {"code": "zh-Hant", "name": "Chinese (Traditional)", "targets": []} in languages
    assert api.translate(TEXTS[1], "en", "zh-Hant") == expected["zt"][1]


# deep-translator POSTs its fields in the query string of a POST with no body, to a base URL with a trailing slash.
def test_deep_translator(server: Server, expected: dict[str, list[str]]) -> None:
    from deep_translator import LibreTranslator

    # Its constructor demands an API key even where the server needs none; the server ignores it then.
    translator = LibreTranslator(source="en", target="zh", api_key="unused", custom_url=f"{server.url}/")
    assert translator.translate(TEXTS[0]) == expected["zh"][0]
    assert translator.translate_batch(TEXTS) == expected["zh"]


def test_npm_libretranslate(server: Server, expected: dict[str, list[str]], node_modules: Path) -> None:
    done = run_node(server, "en", "zh", TEXTS)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == expected["zh"]
    done = run_node(server, "auto", "zt", TEXTS[:1])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == expected["zt"][:1]
    # It checks /languages first: a code the server does not list never reaches /translate.
    done = run_node(server, "en", "fr", TEXTS[:1])
    assert done.returncode != 0 and "not found" in done.stderr
    # LibreTranslate 1.7's codes are listed too.
    done = run_node(server, "en", "zh-Hant", TEXTS[:1])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == expected["zt"][:1]


def test_npm_libretranslate_with_a_key(keyed: Server, expected: dict[str, list[str]], node_modules: Path) -> None:
    # It sends the key as `apiKey`, which the server reads as api_key.
    done = run_node(keyed, "en", "zh", TEXTS, api_key=KEY)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == expected["zh"]
    # A wrong key: the 403's body has no translatedText, so the client returns undefined (printed as null).
    done = run_node(keyed, "en", "zh", TEXTS[:1], api_key="wrong")
    assert done.returncode == 0 and json.loads(done.stdout) == [None], done.stderr


def test_cli_takes_the_same_codes(tiny_multi_onnx_dir: Path, expected: dict[str, list[str]]) -> None:
    assert cli_translations(tiny_multi_onnx_dir, "cmn_Hans", TEXTS) == expected["zh"]
    assert cli_translations(tiny_multi_onnx_dir, "zh-TW", TEXTS[:1]) == expected["zt"][:1]
