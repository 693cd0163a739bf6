"""One service of an opus-mt, an opus-mt-tc-big and an mBART-50 model (tiny random models with the real metadata):
/languages lists each model's pairs in ISO codes, and each pair is translated by the model that has it, as the
library translates it. A real `onnxmt serve` process without torch (tests/helpers/server.py). Then, in process, the
length the service gives a model whose configs name none (MADLAD-400)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from onnxmt import DecodeOptions, Translator
from onnxmt.runtime.options import BatchLimits
from tests.helpers.sentences import SENTENCES
from tests.helpers.server import Server, assert_error, server_fixture

SHORT = {"max_new_tokens": 12}
ENGLISH = SENTENCES[:6]

# opus-mt-en-zh's metadata first (en → 13 Chinese targets), then tc-big (zle → en), then mBART-50 (52 × 51 pairs).
pool = server_fixture("tiny_multi_onnx_dir", "tiny_tc_big_onnx_dir", "tiny_mbart50_onnx_dir", log="families-pool")


@pytest.fixture(scope="module")
def translators(tiny_multi_onnx_dir: Path, tiny_tc_big_onnx_dir: Path, tiny_mbart50_onnx_dir: Path) -> dict:
    directories = {"marian": tiny_multi_onnx_dir, "tc_big": tiny_tc_big_onnx_dir, "mbart": tiny_mbart50_onnx_dir}
    return {name: Translator(d, batching=BatchLimits(8)) for name, d in directories.items()}


def translate(server: Server, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}/translate", json=body, timeout=60)


def test_languages_are_iso_codes_of_every_model(pool: Server) -> None:
    listed = {e["code"]: e["targets"] for e in httpx.get(f"{pool.url}/languages", timeout=30).json()}
    assert {"zh", "zt", "de", "fr"} <= set(listed["en"])  # opus-mt's and mBART-50's targets from English
    assert "en" in listed["zle"] and "en" in listed["de"] and "zh" in listed["ja"]
    assert not any("_" in code for code in listed)  # no fairseq code (en_XX, zh_CN) shown to clients


@pytest.mark.parametrize(
    ("source", "target", "model", "model_pair"),
    [
        ("en", "zh", "marian", (None, "zh")),  # the first model with the pair
        ("zle", "en", "tc_big", (None, None)),  # only tc-big has a zle source
        ("en", "de", "mbart", ("en_XX", "de_DE")),
        ("zh", "en", "mbart", ("zh_CN", "en_XX")),  # tc-big translates into English, but not from Chinese
        ("fr", "zh", "mbart", ("fr_XX", "zh_CN")),
    ],
)
def test_each_pair_goes_to_the_model_that_has_it(
    pool: Server, translators: dict, source: str, target: str, model: str, model_pair: tuple
) -> None:
    expected = translators[model].translate(ENGLISH, source_lang=model_pair[0], target_lang=model_pair[1], **SHORT)
    response = translate(pool, {"q": ENGLISH, "source": source, "target": target, **SHORT})
    assert response.status_code == 200, response.text
    assert response.json()["translatedText"] == [t.text for t in expected]


def test_a_pair_no_model_has_is_a_400(pool: Server) -> None:
    message = assert_error(translate(pool, {"q": "a", "source": "zle", "target": "de"}), 400)
    assert message.startswith("no model translates zle to de")
    assert_error(translate(pool, {"q": "a", "source": "en", "target": "xx"}), 400)


def test_a_model_without_a_length_gets_the_fallback_length(
    tiny_madlad_no_length_onnx_dir: Path, tiny_madlad_onnx_dir: Path
) -> None:
    """transformers' 20 new tokens (the library's default for MADLAD) cut sentences short: the service gives such a
    model --fallback-max-new-tokens (at most its positions); the service's --max-new-tokens and a request's come
    first, and a model with a length of its own keeps it."""
    import time

    from fastapi.testclient import TestClient

    from onnxmt.manifest import read_manifest
    from onnxmt.runtime.search import names_no_length
    from onnxmt.serve.app import create_app
    from onnxmt.serve.options import ServeOptions

    assert not names_no_length(read_manifest(tiny_madlad_onnx_dir))
    translator = Translator(tiny_madlad_no_length_onnx_dir)

    def library(**options: Any) -> list[str]:
        return [t.text for t in translator.translate(SENTENCES, target_lang="zh", **options)]

    def served(options: ServeOptions, decoding: DecodeOptions | None = None, **fields: Any) -> list[str]:
        app = create_app(tiny_madlad_no_length_onnx_dir, options, decoding=decoding or DecodeOptions())
        with TestClient(app) as client:
            deadline = time.monotonic() + 60
            while client.get("/ready").status_code != 200 and time.monotonic() < deadline:
                time.sleep(0.05)
            response = client.post("/translate", json={"q": SENTENCES, "source": "en", "target": "zh", **fields})
            assert response.status_code == 200, response.text
            return response.json()["translatedText"]

    cut = library()  # 20 new tokens at most
    whole = served(ServeOptions())
    assert whole == library(max_new_tokens=256) != cut  # the default: 256, the tiny model's positions
    assert served(ServeOptions(fallback_max_new_tokens=40)) == library(max_new_tokens=40)
    assert served(ServeOptions(fallback_max_new_tokens=0)) == cut
    assert served(ServeOptions(), DecodeOptions(max_new_tokens=30)) == library(max_new_tokens=30)
    assert served(ServeOptions(), max_new_tokens=5) == library(max_new_tokens=5)
