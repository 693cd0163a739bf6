"""`onnxmt serve` and `onnxmt tune` on NLLB-200 (the tiny random model with the real tokenizer metadata, 202
languages on both sides): LibreTranslate's codes for them, answers equal to the library's, detection as the
source, documents and streams, libretranslatepy, one service of an NLLB and a Marian model, and tune's measured
work. Servers are real `onnxmt serve` processes without torch (tests/helpers/server.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from onnxmt import Translator
from onnxmt.cli import app
from onnxmt.documents.html import translate_html
from onnxmt.documents.translate import translate_document, translate_texts
from onnxmt.runtime.options import BatchLimits, RuntimeOptions
from onnxmt.runtime.translator import Translation
from onnxmt.runtime.translator import Translator as DirectoryTranslator
from onnxmt.runtime.tune import tune
from onnxmt.serve.protocol import Languages
from tests.helpers.sentences import SENTENCES
from tests.helpers.server import Server, assert_error, server_fixture

SHORT = {"max_new_tokens": 16}  # the tiny model's outputs run long; the parity is the same at any length
ENGLISH = SENTENCES[:12]  # texts of one word to a page, "Hello world." (which it renders as "") among them
FRENCH = ["Le fleuve est long et la montagne est haute.", "Bonjour, comment allez-vous aujourd'hui ?", "Je sais."]
CHINESE = ["河流很长，山很高。", "他和三个朋友从城里来。"]


@pytest.fixture(scope="module")
def nllb(tiny_nllb_onnx_dir: Path) -> Translator:
    return Translator(tiny_nllb_onnx_dir, batching=BatchLimits(16))


server = server_fixture("tiny_nllb_onnx_dir", log="nllb-serve")


def translate(server: Server, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}/translate", json=body, timeout=60)


def texts_of(translator: Translator, texts: list[str], source: str, target: str) -> list[str]:
    return [t.text for t in translator.translate(texts, source_lang=source, target_lang=target, **SHORT)]


def test_languages_are_libretranslate_codes_with_their_targets(server: Server, nllb: Translator) -> None:
    listed = httpx.get(f"{server.url}/languages", timeout=30).json()
    by_code = {entry["code"]: entry for entry in listed}
    # Each language once, and Chinese's two scripts also under LibreTranslate >= 1.7's codes (docs/serve.md).
    assert len(by_code) == len(listed) == len(nllb.source_languages) + 2 == 204
    assert by_code["en"]["name"] == "English" and by_code["fr"]["name"] == "French"
    assert by_code["zh"]["name"] == "Chinese (Simplified)" and by_code["zt"]["name"] == "Chinese (Traditional)"
    assert by_code["zh-Hans"]["name"] == by_code["zh"]["name"] and by_code["zh-Hant"]["name"] == by_code["zt"]["name"]
    everything = set(by_code)
    simplified, traditional = {"zh", "zh-Hans"}, {"zt", "zh-Hant"}
    same = {"zh": simplified, "zh-Hans": simplified, "zt": traditional, "zh-Hant": traditional}
    for code, entry in by_code.items():  # every language into every other, never into itself
        assert set(entry["targets"]) == everything - same.get(code, {code}), code
    assert by_code["en"]["targets"][:3] == ["af", "ak", "am"]  # ISO 639-1 codes first, as LibreTranslate lists them
    # Any listed code, sent back, reaches the model's own language.
    for code in everything:
        assert nllb.source_code(code) in nllb.source_languages, code
        assert nllb.target_token(code) == nllb.target_token(nllb.source_code(code)), code
    assert [nllb.source_code(c) for c in ("zh", "zt", "fr")] == ["zho_Hans", "zho_Hant", "fra_Latn"]
    info = httpx.get(f"{server.url}/info", timeout=30).json()
    assert info["languages"]["source"] == "en" and len(info["languages"]["sources"]) == 202  # its default source
    # 202 x 201 pairs are counted, not listed: /languages above lists them per source.
    assert info["routing"]["pair_count"] == 202 * 201 and "pairs" not in info["routing"]
    assert len(httpx.get(f"{server.url}/info", timeout=30).content) < 100_000


def test_translate_answers_as_the_library(server: Server, nllb: Translator) -> None:
    into_zh = texts_of(nllb, ENGLISH, "eng_Latn", "zho_Hans")
    assert len(set(into_zh)) >= 4 and "" in into_zh  # many different answers: the equalities below are not empty
    for target in ("zh", "zh-Hans", "zho_Hans", "cmn_Hans"):
        response = translate(server, {"q": ENGLISH, "source": "en", "target": target, **SHORT})
        assert response.status_code == 200, response.text
        assert response.json() == {"translatedText": into_zh}, target
    one = translate(server, {"q": ENGLISH[1], "source": "eng_Latn", "target": "zh", **SHORT})
    assert one.json() == {"translatedText": into_zh[1]}
    for source, target, texts, model_pair in (
        ("en", "fr", ENGLISH, ("eng_Latn", "fra_Latn")),
        ("en", "zt", ENGLISH, ("eng_Latn", "zho_Hant")),
        ("fr", "zh", FRENCH + ENGLISH, ("fra_Latn", "zho_Hans")),
        ("zh", "en", CHINESE, ("zho_Hans", "eng_Latn")),
    ):
        response = translate(server, {"q": texts, "source": source, "target": target, **SHORT})
        assert response.status_code == 200, response.text
        assert response.json()["translatedText"] == texts_of(nllb, texts, *model_pair), (source, target)
    # The source is the model's to read: the same texts from French are not the same translations.
    from_french = translate(server, {"q": ENGLISH, "source": "fr", "target": "zh", **SHORT}).json()
    assert from_french["translatedText"] != into_zh


def test_unknown_languages_are_a_400_naming_the_valid_codes(server: Server) -> None:
    message = assert_error(translate(server, {"q": "a", "source": "en", "target": "xx"}), 400)
    assert message.startswith("unknown target language 'xx'; valid: ")
    assert "zh (zho_Hans)" in message and "fr (fra_Latn)" in message and "en (eng_Latn)" in message
    message = assert_error(translate(server, {"q": "a", "source": "klingon", "target": "zh"}), 400)
    assert message.startswith("unknown source language 'klingon'; valid: auto, ") and "fr (fra_Latn)" in message
    # NLLB has no default target (the model card leaves it to the caller).
    assert "target language" in assert_error(translate(server, {"q": "a", "source": "en"}), 400)


def test_auto_translates_from_the_detected_language(server: Server, nllb: Translator) -> None:
    for texts, code, model_code in ((ENGLISH[7:9], "en", "eng_Latn"), (FRENCH, "fr", "fra_Latn")):
        response = translate(server, {"q": texts, "source": "auto", "target": "zh", **SHORT})
        assert response.status_code == 200, response.text
        body = response.json()
        assert [d["language"] for d in body["detectedLanguage"]] == [code] * len(texts)
        assert body["translatedText"] == texts_of(nllb, texts, model_code, "zho_Hans"), code
    # Told the detected language, not the model's default (English): the French answer is not the English one.
    assert texts_of(nllb, FRENCH, "fra_Latn", "zho_Hans") != texts_of(nllb, FRENCH, "eng_Latn", "zho_Hans")
    no_source = translate(server, {"q": CHINESE[0], "target": "en", **SHORT}).json()
    assert no_source["detectedLanguage"]["language"] == "zh"
    assert no_source["translatedText"] == texts_of(nllb, CHINESE[:1], "zho_Hans", "eng_Latn")[0]
    detected = httpx.post(f"{server.url}/detect", json={"q": FRENCH[1]}, timeout=30).json()
    assert detected[0]["language"] == "fr"


def test_html_and_stream_answer_as_the_library(server: Server, nllb: Translator) -> None:
    languages = {"source_lang": "fra_Latn", "target_lang": "zho_Hans", **SHORT}
    page = f"<p>{FRENCH[0]} <b>{FRENCH[1]}</b></p>"
    html = translate(server, {"q": page, "source": "fr", "target": "zh", "format": "html", **SHORT})
    assert html.status_code == 200, html.text
    expected = translate_html(page, lambda texts: translate_texts(nllb, texts, **languages))
    assert html.json()["translatedText"] == expected and expected.count("<b>") == 1
    text = f"{FRENCH[0]} {FRENCH[1]}\n\n{FRENCH[0]}"
    whole = translate_document(nllb, text, **languages)
    for source in ("fr", "auto"):  # auto: detected once on the whole text
        body = {"q": text, "source": source, "target": "zh", **SHORT}
        stream = httpx.post(f"{server.url}/translate/stream", json=body, timeout=60)
        assert stream.status_code == 200, stream.text
        events = [block.splitlines() for block in stream.text.strip().split("\n\n")]
        assert events[-1][0] == "event: done" and json.loads(events[-1][1][6:]) == {"translatedText": whole}
        pieces = [json.loads(lines[0][6:])["translatedText"] for lines in events[:-1]]
        assert "".join(pieces) == whole and len(pieces) >= 3, source


def test_libretranslatepy(server: Server, nllb: Translator) -> None:
    from libretranslatepy import LibreTranslateAPI

    api = LibreTranslateAPI(server.url)
    for text, source, target, model_pair in (
        (ENGLISH[1], "en", "zh", ("eng_Latn", "zho_Hans")),
        (ENGLISH[7], "en", "fr", ("eng_Latn", "fra_Latn")),
        (FRENCH[0], "auto", "zh", ("fra_Latn", "zho_Hans")),
        (CHINESE[1], "zh", "en", ("zho_Hans", "eng_Latn")),
    ):
        want = nllb.translate([text], source_lang=model_pair[0], target_lang=model_pair[1])[0].text
        assert api.translate(text, source, target) == want, (source, target)
    assert {"zh", "fr"} <= set(next(e for e in api.languages() if e["code"] == "en")["targets"])
    assert api.detect(FRENCH[1])[0]["language"] == "fr"


# --- NLLB and Marian in one service ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def marian(tiny_multi_onnx_dir: Path) -> Translator:
    return Translator(tiny_multi_onnx_dir, batching=BatchLimits(16))


# opus-mt-en-zh's metadata (en → 13 Chinese targets) first, then NLLB: en → zh is Marian's, the rest NLLB's.
pool = server_fixture("tiny_multi_onnx_dir", "tiny_nllb_onnx_dir", log="nllb-pool")


def test_pool_routes_each_pair_to_its_model(pool: Server, marian: Translator, nllb: Translator) -> None:
    by_marian = [t.text for t in marian.translate(ENGLISH, target_lang="zh", **SHORT)]
    by_nllb = texts_of(nllb, ENGLISH, "eng_Latn", "zho_Hans")
    assert by_marian != by_nllb  # which model answered shows in the answer
    into_zh = translate(pool, {"q": ENGLISH, "source": "en", "target": "zh", **SHORT})
    assert into_zh.status_code == 200 and into_zh.json()["translatedText"] == by_marian, into_zh.text
    auto = translate(pool, {"q": ENGLISH[7:9], "source": "auto", "target": "zh", **SHORT}).json()
    assert auto["translatedText"] == by_marian[7:9]
    for source, target, texts, model_pair in (
        ("en", "fr", ENGLISH, ("eng_Latn", "fra_Latn")),  # Marian has no French
        ("fr", "zh", FRENCH, ("fra_Latn", "zho_Hans")),  # nor a French source
        ("zh", "en", CHINESE, ("zho_Hans", "eng_Latn")),
    ):
        response = translate(pool, {"q": texts, "source": source, "target": target, **SHORT})
        assert response.status_code == 200, response.text
        assert response.json()["translatedText"] == texts_of(nllb, texts, *model_pair), (source, target)
    auto = translate(pool, {"q": FRENCH, "source": "auto", "target": "zh", **SHORT}).json()
    assert auto["translatedText"] == texts_of(nllb, FRENCH, "fra_Latn", "zho_Hans")
    assert auto["detectedLanguage"][0]["language"] == "fr"
    models = {m["name"]: m for m in httpx.get(f"{pool.url}/info", timeout=30).json()["models"]}
    assert [m["loaded"] for m in models.values()] == [True, True]


def test_pool_languages_and_errors(pool: Server, marian: Translator, nllb: Translator) -> None:
    listed = {e["code"]: e["targets"] for e in httpx.get(f"{pool.url}/languages", timeout=30).json()}
    # NLLB's, and the Marian targets NLLB has no code for (cmn, yue-Hans, ...)
    alone = [Languages(t.manifest).libretranslate() for t in (marian, nllb)]
    assert set(listed) == {e["code"] for entries in alone for e in entries} and len(listed) > 202
    assert {"zh", "zt", "yue-Hans", "fr"} <= set(listed["en"]) and "en" not in listed["en"]
    assert "en" in listed["fr"] and "yue-Hans" not in listed["fr"]  # only Marian has it, and only from English
    message = assert_error(translate(pool, {"q": "a", "source": "fr", "target": "yue-Hans"}), 400)
    # The pairs from the request's source only: with every pair the message would list 40,000.
    assert message.startswith("no model translates fr to yue-Hans; available pairs: fr→af, ")
    assert "fr→en" in message and "en→" not in message and len(message) < 5000


# --- onnxmt tune -----------------------------------------------------------------------------------------------


def test_tune_measures_nllb_into_the_target_language(
    tiny_nllb_onnx_dir: Path, nllb: Translator, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[Translation] = []
    run = DirectoryTranslator.translate  # the class tune's Translators are (onnxmt.Translator derives from it)

    def recording(self: Translator, *args: Any, **kwargs: Any) -> list[Translation]:
        out = run(self, *args, **kwargs)
        made.extend(out)
        return out

    monkeypatch.setattr(DirectoryTranslator, "translate", recording)
    settings = [RuntimeOptions(threads=1, verify=False), RuntimeOptions(threads=2, spinning=True, verify=False)]
    results = tune(tiny_nllb_onnx_dir, settings, texts=FRENCH, tokens=3, batch_size=2, rounds=2,
                   source_lang="fr", target_lang="zh")  # fmt: skip
    assert [(r.threads, r.spinning) for r in results] == [(1, False), (2, True)]
    assert all(r.latency_ms > 0 and r.tokens_per_s > 0 for r in results)
    # The work measured: French read, Chinese written, 3 decoder steps each (the first writes the language token).
    zh = nllb.tokenizer.token_id("zho_Hans")
    assert made and all(t.token_ids[0] == zh and len(t.token_ids) == 3 for t in made)
    forced = {"beams": 1, "max_new_tokens": 3, "min_new_tokens": 3}
    expected = run(nllb, FRENCH, source_lang="fra_Latn", target_lang="zho_Hans", **forced)
    # The last round of the last setting: each text alone, then a batch of 2.
    alone, batch = made[-len(FRENCH) - 2 : -2], made[-2:]
    assert [t.token_ids for t in alone] == [t.token_ids for t in expected]
    assert [t.token_ids for t in batch] == [t.token_ids for t in expected[:2]]


def test_tune_cli_on_nllb(tiny_nllb_onnx_dir: Path) -> None:
    args = ["tune", "-m", str(tiny_nllb_onnx_dir), "--max-threads", "1", "--tokens", "2", "--batch-size", "2"]
    result = CliRunner().invoke(app, [*args, "--rounds", "1", "--target-lang", "fr"], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    assert "batch-1 latency" in result.output and "lowest latency: RuntimeOptions(threads=1" in result.output
    unknown = CliRunner().invoke(app, [*args, "--target-lang", "xx"], env={"COLUMNS": "160"})
    assert unknown.exit_code == 2 and "unknown target language 'xx'" in unknown.output
    # No target: NLLB has no default one, and the error names the valid codes.
    missing = CliRunner().invoke(app, args, env={"COLUMNS": "160"})
    assert missing.exit_code == 2 and "needs a target language" in missing.output


def test_m2m100_is_served_the_same_way(tiny_m2m100_onnx_dir: Path) -> None:
    # NLLB's older sibling: 100 languages on both sides, codes `en`, `zh` with tokens `__en__`, `__zh__`.
    import time

    from fastapi.testclient import TestClient

    from onnxmt.serve.app import create_app
    from onnxmt.serve.options import ServeOptions

    m2m100 = Translator(tiny_m2m100_onnx_dir)
    with TestClient(create_app(tiny_m2m100_onnx_dir, ServeOptions())) as client:
        deadline = time.monotonic() + 60
        while client.get("/ready").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        listed = {e["code"]: e["targets"] for e in client.get("/languages").json()}
        # M2M100's 100 languages, and zh-Hans beside zh (docs/serve.md)
        assert len(listed) == 101 and set(listed["en"]) == set(listed) - {"en"}
        for source, texts in (("en", ENGLISH), ("fr", FRENCH)):
            want = texts_of(m2m100, texts, source, "zh")
            assert any(want)
            named = client.post("/translate", json={"q": texts, "source": source, "target": "zh", **SHORT}).json()
            auto = client.post("/translate", json={"q": texts, "source": "auto", "target": "zh", **SHORT}).json()
            assert named["translatedText"] == auto["translatedText"] == want, source
            assert auto["detectedLanguage"][0]["language"] == source
