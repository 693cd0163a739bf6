"""Many models in one service (serve/pool.py, serve/catalog.py): two model directories, en→zh (the 13-token tiny
model, opus-mt-en-zh's metadata) and zh→en (opus-mt-zh-en's), served by one `onnxmt serve` process; routing by
(source, target) with the HTTP API, libretranslatepy and the npm client, lazy loading and least-recently-used
unloading, the pivot, a directory of model directories, the page."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from onnxmt import DecodeOptions, Translator
from onnxmt.documents.translate import translate_document
from onnxmt.runtime.modeldir import load_manifest
from onnxmt.runtime.options import BatchLimits
from onnxmt.runtime.translator import Translation
from onnxmt.serve.batcher import MicroBatcher
from onnxmt.serve.metrics import Metrics
from onnxmt.serve.options import ServeOptions
from onnxmt.serve.pool import ModelEntry, ModelPool
from onnxmt.serve.protocol import Languages
from onnxmt.testing import generate_corpus
from tests.helpers.browser import headless_chromium, translation_done
from tests.helpers.node import run_node
from tests.helpers.server import Server, assert_error, metric_sample, server_fixture, start_server

ENGLISH, CHINESE = (texts[:8] for texts in generate_corpus(7, lines=64))
SHORT = {"max_new_tokens": 12}  # the tiny models' outputs run long; the parity is the same at any length


@pytest.fixture(scope="module")
def models(tiny_multi_onnx_dir: Path, tiny_zh_en_onnx_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory of model directories: en-zh and zh-en (links to the session's exports)."""
    root = tmp_path_factory.mktemp("models")
    (root / "en-zh").symlink_to(tiny_multi_onnx_dir, target_is_directory=True)
    (root / "zh-en").symlink_to(tiny_zh_en_onnx_dir, target_is_directory=True)
    (root / "notes").mkdir()  # not a model directory: skipped
    return root


@pytest.fixture(scope="module")
def en_zh(tiny_multi_onnx_dir: Path) -> Translator:
    return Translator(tiny_multi_onnx_dir, batching=BatchLimits(16))


@pytest.fixture(scope="module")
def zh_en(tiny_zh_en_onnx_dir: Path) -> Translator:
    return Translator(tiny_zh_en_onnx_dir, batching=BatchLimits(16))


@pytest.fixture(scope="module")
def server(models: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The two directories given one by one, with a pivot through English."""
    running = start_server([models / "en-zh", models / "zh-en"], tmp_path_factory.mktemp("pool"), pivot="en")
    yield running
    assert running.stop() == 0, running.logs()


# The directory of model directories, one model loaded at a time, no cache (every request reaches a model).
budget_server = server_fixture("models", log="pool-budget", max_loaded_models=1, cache_size=0)


def translate(server: Server, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}/translate", json=body, timeout=60)


def models_info(server: Server) -> dict[str, dict[str, Any]]:
    info = httpx.get(f"{server.url}/info", timeout=10).json()
    return {m["name"]: m for m in info["models"]}


def test_both_directions_answer_as_the_library(server: Server, en_zh: Translator, zh_en: Translator) -> None:
    into_zh = translate(server, {"q": ENGLISH, "source": "en", "target": "zh", **SHORT})
    assert into_zh.status_code == 200, into_zh.text
    assert into_zh.json() == {"translatedText": [t.text for t in en_zh.translate(ENGLISH, target_lang="zh", **SHORT)]}
    into_en = translate(server, {"q": CHINESE, "source": "zh", "target": "en", **SHORT})
    assert into_en.status_code == 200, into_en.text
    assert into_en.json() == {"translatedText": [t.text for t in zh_en.translate(CHINESE, **SHORT)]}
    # The same pair by other codes, and `auto` routed by the detected language.
    assert translate(server, {"q": CHINESE, "source": "zho", "target": "eng", **SHORT}).json() == into_en.json()
    auto = translate(server, {"q": CHINESE[0], "source": "auto", "target": "en", **SHORT}).json()
    assert auto["translatedText"] == into_en.json()["translatedText"][0]
    assert auto["detectedLanguage"]["language"] == "zh"
    # Nothing to detect: routed to a model that reaches the target, empty texts give empty translations.
    empty = translate(server, {"q": ["", " "], "source": "auto", "target": "en"})
    assert empty.status_code == 200 and empty.json()["translatedText"] == ["", ""], empty.text


def test_libretranslatepy_both_directions(server: Server, en_zh: Translator, zh_en: Translator) -> None:
    from libretranslatepy import LibreTranslateAPI

    api = LibreTranslateAPI(server.url)
    assert api.translate(ENGLISH[1], "en", "zh") == en_zh.translate([ENGLISH[1]], target_lang="zh")[0].text
    assert api.translate(CHINESE[1], "zh", "en") == zh_en.translate([CHINESE[1]])[0].text
    assert api.translate(ENGLISH[2], "auto", "zt") == en_zh.translate([ENGLISH[2]], target_lang="zt")[0].text
    languages = {entry["code"]: entry for entry in api.languages()}
    assert {"zh", "zt", "yue"} <= set(languages["en"]["targets"])
    # zh → en directly; zh → zt and the other Chinese targets through English (--pivot en); never zh → zh.
    assert languages["zh"]["targets"][0] == "en" and "zt" in languages["zh"]["targets"]
    assert "zh" not in languages["zh"]["targets"]
    assert languages["zh"]["name"] == "Chinese (Simplified)" and languages["en"]["name"] == "English"


@pytest.mark.usefixtures("node_modules")  # installs the npm package, or skips without npm
def test_npm_libretranslate_both_directions(server: Server, en_zh: Translator, zh_en: Translator) -> None:
    # It checks /languages before it translates: the merged list must offer both directions.
    done = run_node(server, "zh", "en", CHINESE[6:7])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [zh_en.translate(CHINESE[6:7])[0].text]
    done = run_node(server, "en", "zh", ENGLISH[6:7])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [en_zh.translate(ENGLISH[6:7], target_lang="zh")[0].text]


def test_pivot_is_marked(server: Server, en_zh: Translator, zh_en: Translator) -> None:
    texts = CHINESE[:3]
    response = translate(server, {"q": texts, "source": "zh", "target": "zt", **SHORT})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["pivot"] == "en"
    english = [t.text for t in zh_en.translate(texts, **SHORT)]
    assert body["translatedText"] == [t.text for t in en_zh.translate(english, target_lang="zt", **SHORT)]
    direct = translate(server, {"q": texts, "source": "zh", "target": "en", **SHORT}).json()
    assert "pivot" not in direct and direct["translatedText"] == english


def test_unknown_pair_names_the_available_pairs(server: Server) -> None:
    # The pairs from the request's source (a service with NLLB-200 has 40,000 in all).
    message = assert_error(translate(server, {"q": "a", "source": "en", "target": "fr"}), 400)
    assert message.startswith("no model translates en to fr; available pairs: en→zh, en→zt, ")
    assert "zh→" not in message
    message = assert_error(translate(server, {"q": "a", "source": "zh", "target": "fr"}), 400)
    assert message.startswith("no model translates zh to fr; available pairs: zh→en, ")
    assert "zh→zt" in message and "en→" not in message  # through the pivot
    assert "valid: auto, en, zh" in assert_error(translate(server, {"q": "a", "source": "de", "target": "en"}), 400)
    assert_error(translate(server, {"q": "a", "source": "zh", "target": "zh"}), 400)  # no model, no pivot for it


def test_info_and_metrics_per_model(server: Server) -> None:
    models = models_info(server)
    assert set(models) == {"en-zh", "zh-en"}
    assert models["zh-en"]["languages"] == {"source": "zh", "sources": ["zh"], "targets": ["en"], "default": None}
    assert models["en-zh"]["languages"]["source"] == "en" and models["en-zh"]["architecture"] == "marian"
    info = httpx.get(f"{server.url}/info").json()
    assert "model" not in info and info["routing"]["pivot"] == "en" and "zh→en" in info["routing"]["pairs"]
    assert info["routing"]["pair_count"] == len(info["routing"]["pairs"])
    translate(server, {"q": CHINESE[4], "source": "zh", "target": "en", **SHORT})
    metrics = httpx.get(f"{server.url}/metrics").text
    assert metric_sample(metrics, "onnxmt_model_loaded", model="zh-en") == 1
    assert metric_sample(metrics, "onnxmt_translated_texts_total", model="zh-en") >= 1
    assert 'onnxmt_batch_size_count{model="en-zh"}' in metrics


def test_directory_of_models_loads_lazily_and_unloads_the_least_recently_used(
    budget_server: Server, en_zh: Translator, zh_en: Translator
) -> None:
    models = models_info(budget_server)
    assert set(models) == {"en-zh", "zh-en"}  # `notes` is no model directory
    assert [(m["loaded"], m["loads"]) for m in models.values()] == [(False, 0), (False, 0)]
    expected: dict[str, list[tuple[int, int]]] = {"en-zh": [], "zh-en": []}
    for i in range(4):  # en-zh, zh-en, en-zh, zh-en: each request loads its model and unloads the other
        if i % 2 == 0:
            body = {"q": ENGLISH[i], "source": "en", "target": "zh", **SHORT}
            want = en_zh.translate([ENGLISH[i]], target_lang="zh", **SHORT)[0].text
        else:
            body = {"q": CHINESE[i], "source": "zh", "target": "en", **SHORT}
            want = zh_en.translate([CHINESE[i]], **SHORT)[0].text
        response = translate(budget_server, body)
        assert response.status_code == 200 and response.json()["translatedText"] == want, response.text
        models = models_info(budget_server)
        assert [m["loaded"] for m in models.values()] == [i % 2 == 0, i % 2 == 1]
        for name in expected:
            expected[name].append((models[name]["loads"], models[name]["unloads"]))
    assert expected == {"en-zh": [(1, 0), (1, 1), (2, 1), (2, 2)], "zh-en": [(0, 0), (1, 0), (1, 1), (2, 1)]}
    metrics = httpx.get(f"{budget_server.url}/metrics").text
    assert metric_sample(metrics, "onnxmt_model_loads_total", model="en-zh") == 2
    assert metric_sample(metrics, "onnxmt_model_unloads_total", model="zh-en") == 1


def test_concurrent_requests_for_two_models_within_a_budget_of_one(
    budget_server: Server, en_zh: Translator, zh_en: Translator
) -> None:
    # Each unload waits until its model's requests are answered: every request gets its own translation.
    jobs = [("en", "zh", ENGLISH[i]) if i % 2 else ("zh", "en", CHINESE[i]) for i in range(8)]

    async def send_all() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=budget_server.url, timeout=60) as client:
            bodies = [{"q": q, "source": s, "target": t, **SHORT} for s, t, q in jobs]
            return await asyncio.gather(*(client.post("/translate", json=b) for b in bodies))

    responses = asyncio.run(send_all())
    for response, (source, _, text) in zip(responses, jobs, strict=True):
        assert response.status_code == 200, response.text
        if source == "en":
            want = en_zh.translate([text], target_lang="zh", **SHORT)[0].text
        else:
            want = zh_en.translate([text], **SHORT)[0].text
        assert response.json()["translatedText"] == want
    assert sum(m["loaded"] for m in models_info(budget_server).values()) == 1


# --- the pool in process: budgets by size, draining ---------------------------------------------------------------


def _echo(texts: list[str], options: DecodeOptions, tokens: object, on_batch: object = None) -> list[Translation]:
    return [Translation(text, [], 0.0) for text in texts]


@dataclass(frozen=True)
class _Opener:
    """Opens stand-ins for translators: loading is not what is tested here, choosing what to unload is."""

    options: ServeOptions
    executor: Any = None  # the event loop's default executor
    metrics: Metrics = field(default_factory=Metrics)

    def check(self, entry: ModelEntry) -> None:
        pass

    def load(self, entry: ModelEntry) -> Any:
        return object()

    def make_batcher(self, entry: ModelEntry) -> MicroBatcher:
        return MicroBatcher(_echo, None, limits=BatchLimits(4), window=0, max_queue=8)


def _pool(model_dir: Path, names: list[str], **budget: float) -> ModelPool:
    """A pool of models of 100 bytes each; `budget`: ServeOptions' max_loaded_models, max_loaded_mb."""
    manifest = load_manifest(model_dir)
    entries = [ModelEntry(name, model_dir, manifest, Languages(manifest), bytes=100) for name in names]
    return ModelPool(entries, _Opener(ServeOptions(**budget)))


def test_size_budget_unloads_the_least_recently_used(tiny_onnx_dir: Path) -> None:
    pool = _pool(tiny_onnx_dir, ["a", "b", "c"], max_loaded_mb=250 / 2**20)  # two models of 100 bytes fit, three do not
    a, b, c = pool.entries

    async def main() -> list[list[str]]:
        seen = []
        for entry in (a, b, c, b, a):
            async with pool.use(entry):
                pass
            seen.append([e.name for e in pool.loaded])
        await pool.stop()
        return seen

    assert asyncio.run(main()) == [["a"], ["a", "b"], ["b", "c"], ["b", "c"], ["a", "b"]]
    assert [(e.loads, e.unloads) for e in (a, b, c)] == [(2, 1), (1, 0), (1, 1)]


def test_a_model_in_use_is_unloaded_only_once_its_requests_are_answered(tiny_onnx_dir: Path) -> None:
    pool = _pool(tiny_onnx_dir, ["a", "b"], max_loaded_models=1)
    a, b = pool.entries

    async def main() -> None:
        release = asyncio.Event()

        async def hold_a() -> None:
            async with pool.use(a):
                await release.wait()

        holder = asyncio.create_task(hold_a())
        await asyncio.sleep(0.01)
        wanting_b = asyncio.create_task(pool.acquire(b))
        await asyncio.sleep(0.05)
        assert a.translator is not None and a.evicting and b.translator is None  # waiting for a's request
        release.set()
        await holder
        await wanting_b
        assert a.translator is None and b.translator is not None and (a.unloads, b.loads) == (1, 1)
        assert b.active == 1  # held for the request that waited for it
        pool.release(b)
        await pool.stop()

    asyncio.run(main())


def test_page_chooses_source_and_target_swaps_and_copies(
    server: Server, en_zh: Translator, zh_en: Translator, tmp_path: Path
) -> None:
    browser = headless_chromium(tmp_path / "profile")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    languages = {entry["code"]: entry["targets"] for entry in httpx.get(f"{server.url}/languages").json()}

    def values(select: str) -> list[str]:
        return [o.get_attribute("value") for o in browser.find_elements(By.CSS_SELECTOR, f"#{select} option")]

    def translated(before: str) -> str:
        browser.find_element(By.ID, "translate").click()
        # The page reads /translate/stream: done when its status clears and the button is back.
        wait.until(translation_done)
        return str(browser.find_element(By.ID, "result").get_attribute("textContent"))

    try:
        browser.get(f"{server.url}/")
        wait = WebDriverWait(browser, 30)
        wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, "#source option")) == 3)
        assert values("source") == ["auto", "en", "zh"]
        Select(browser.find_element(By.ID, "source")).select_by_value("zh")
        # en, and the Chinese targets through the pivot; the page shows each language once (not zh-Hant beside zt).
        assert values("target") == [t for t in languages["zh"] if t not in ("zh-Hans", "zh-Hant")]
        Select(browser.find_element(By.ID, "target")).select_by_value("en")
        text = browser.find_element(By.ID, "text")
        text.send_keys(CHINESE[5])
        english = translated("")
        assert english and english == translate_document(zh_en, CHINESE[5])
        browser.find_element(By.ID, "swap").click()  # en → zh now, the translation as the text to translate
        assert browser.find_element(By.ID, "source").get_attribute("value") == "en"
        assert browser.find_element(By.ID, "target").get_attribute("value") == "zh"
        assert text.get_attribute("value") == english
        assert translated(english) == translate_document(en_zh, english, target_lang="zh")
        browser.find_element(By.ID, "copy").click()
        wait.until(lambda b: b.find_element(By.ID, "note").text == "copied")
        assert browser.find_element(By.ID, "error").text == ""
        violations = [e["message"] for e in browser.get_log("browser") if "Content Security Policy" in e["message"]]
        assert not violations, violations
    finally:
        browser.quit()


def test_two_models_under_a_budget_of_one_take_turns_without_livelock(tiny_onnx_dir: Path) -> None:
    # Requests for a and b at once: each load hands the model to the requests that waited for it before another
    # load may unload it, so every request is answered and the models are loaded a bounded number of times.
    pool = _pool(tiny_onnx_dir, ["a", "b"], max_loaded_models=1)
    answered: list[str] = []

    async def request(entry: ModelEntry) -> None:
        async with pool.use(entry):
            await asyncio.sleep(0.001)
            answered.append(entry.name)

    async def main() -> None:
        await asyncio.wait_for(asyncio.gather(*(request(pool.entries[i % 2]) for i in range(40))), timeout=10)
        await pool.stop()

    asyncio.run(main())
    assert sorted(answered) == ["a"] * 20 + ["b"] * 20
    assert sum(e.loads for e in pool.entries) <= 40


def test_documents_are_routed_too(server: Server, en_zh: Translator, zh_en: Translator) -> None:
    # format html and multi-sentence texts on a service of two models: each direction's model splits and
    # translates, as the library does with that model.
    from onnxmt.documents.files import translate_string
    from onnxmt.documents.html import translate_html
    from onnxmt.documents.translate import translate_texts

    page = f"<p>{CHINESE[0]}<b>{CHINESE[1]}</b></p>"
    html = translate(server, {"q": page, "source": "zh", "target": "en", "format": "html", **SHORT})
    assert html.status_code == 200, html.text
    expected = translate_html(page, lambda texts: translate_texts(zh_en, texts, **SHORT))
    assert html.json()["translatedText"] == expected and expected.count("<b>") == 1
    text = f"{ENGLISH[0]} {ENGLISH[1]}\n\n{ENGLISH[2]}"
    upload = httpx.post(
        f"{server.url}/translate_file",
        data={"source": "en", "target": "zh", **{k: str(v) for k, v in SHORT.items()}},
        files={"file": ("a.txt", text.encode(), "text/plain")},
        timeout=60,
    )
    assert upload.status_code == 200, upload.text
    got = httpx.get(upload.json()["translatedFileUrl"], timeout=30).text
    assert got == translate_string(en_zh, text, "text", target_lang="zh", **SHORT)  # plain text: line by line
