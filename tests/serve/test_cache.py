"""The translation cache (serve/cache.py): an LRU of translations by (model, prepared text), per text; in the service,
cached answers equal uncached ones and /metrics counts hits and misses."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from onnxmt import Translator
from onnxmt.architectures import Prompt
from onnxmt.runtime.options import BatchLimits
from onnxmt.runtime.search import Settings
from onnxmt.runtime.translator import Prepared, Translation
from onnxmt.serve.app import create_app
from onnxmt.serve.cache import TranslationCache, entry_bytes
from onnxmt.serve.options import ServeOptions
from onnxmt.testing import generate_corpus
from tests.helpers.server import metric_sample

TEXTS = generate_corpus(11, lines=32)[0]
SETTINGS = Settings(
    num_beams=4, max_length=20, min_length=0, length_penalty=1.0, early_stopping=False, num_return_sequences=1,
    decoder_start=9, eos_ids=(0,), pad=9,
)  # fmt: skip
HANS = Prompt(text=">>cmn_Hans<< ")


def _key(text: str, prompt: Prompt = HANS, settings: Settings = SETTINGS, model: str = "m") -> tuple[str, Prepared]:
    return model, Prepared(text, (len(text), 0), prompt, settings)


def _t(text: str, cancelled: bool = False) -> Translation:
    return Translation(text, [1, 2], -1.0, cancelled=cancelled)


def test_least_recently_used_is_dropped() -> None:
    cache = TranslationCache(2)
    cache.put(_key("a"), _t("A"))
    cache.put(_key("b"), _t("B"))
    assert cache.get(_key("a")) == _t("A")  # a is now the most recently used
    cache.put(_key("c"), _t("C"))
    assert len(cache) == 2 and cache.get(_key("b")) is None
    assert cache.get(_key("a")) == _t("A") and cache.get(_key("c")) == _t("C")


def test_the_key_is_model_prompt_settings_and_text() -> None:
    cache = TranslationCache(10)
    cache.put(_key("a"), _t("A"))
    assert cache.get(_key("a", model="other")) is None
    assert cache.get(_key("a", prompt=Prompt(text=">>cmn_Hant<< "))) is None
    assert cache.get(_key("a", settings=replace(SETTINGS, num_beams=2))) is None
    assert cache.get(_key("b")) is None
    assert cache.get(_key("a", prompt=Prompt(text=">>cmn_Hans<< "))) == _t("A")  # equal prepared text, equal key


def test_size_zero_is_off_and_cancelled_work_is_never_kept() -> None:
    off = TranslationCache(0)
    off.put(_key("a"), _t("A"))
    assert len(off) == 0 and off.get(_key("a")) is None
    cache = TranslationCache(10)
    cache.put(_key("a"), _t("", cancelled=True))
    assert cache.get(_key("a")) is None
    with pytest.raises(ValueError, match="must not be negative"):
        TranslationCache(-1)


def test_bytes_are_bounded_whatever_the_entry_count() -> None:
    """Entries are dropped by bytes too: 200 long texts (the issue's 261k-character sentences, smaller here) fill a
    cache of 10,000 entries only up to its bytes, and the counted bytes follow what the entries hold."""
    limit = 4 << 20
    cache = TranslationCache(10_000, limit)
    text = "x" * 100_000
    for i in range(200):
        cache.put(_key(f"{i}{text}"), _t(text))
    assert cache.bytes <= limit < 200 * 2 * len(text)
    assert 15 <= len(cache) <= limit // (2 * len(text))  # each entry holds ~200 KB: about 20 fit
    assert cache.get(_key(f"199{text}")) is not None and cache.get(_key(f"0{text}")) is None
    assert cache.bytes == sum(entry_bytes(k, t) for k, (t, _) in cache._entries.items())
    cache.put(_key("199" + text), _t("short"))  # replaced: its old bytes are given back
    assert cache.bytes == sum(entry_bytes(k, t) for k, (t, _) in cache._entries.items())
    alone = TranslationCache(10, 1000)
    alone.put(_key(text), _t(text))  # larger than the whole cache: not kept, nothing pushed out
    assert len(alone) == 0 and alone.bytes == 0


# --- in the service ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def client(tiny_multi_onnx_dir: Path) -> Iterator[TestClient]:
    with TestClient(create_app(tiny_multi_onnx_dir, ServeOptions(cache_size=1000))) as test_client:
        deadline = time.monotonic() + 60
        while test_client.get("/ready").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        yield test_client


def _counts(client: TestClient) -> tuple[float, float, float]:
    """Cache hits, cache misses, texts the decoder translated."""
    text = client.get("/metrics").text
    hits, misses, decoded = (
        metric_sample(text, name, model="model")
        for name in ("onnxmt_cache_hits_total", "onnxmt_cache_misses_total", "onnxmt_translated_texts_total")
    )
    return hits, misses, decoded


def test_sixteen_texts_of_which_ten_are_cached_decode_six(client: TestClient, tiny_multi_onnx_dir: Path) -> None:
    body = {"target": "zh", "beams": 2, "max_new_tokens": 16}
    before = _counts(client)
    first = client.post("/translate", json={**body, "q": TEXTS[:10]})
    assert first.status_code == 200, first.text
    middle = _counts(client)
    assert [b - a for a, b in zip(before, middle, strict=True)] == [0, 10, 10]
    second = client.post("/translate", json={**body, "q": TEXTS[:16]})
    assert second.status_code == 200, second.text
    after = _counts(client)
    assert [b - a for a, b in zip(middle, after, strict=True)] == [10, 6, 6]  # hits, misses, texts decoded
    # The cached answers are the uncached ones, and the library's.
    assert second.json()["translatedText"][:10] == first.json()["translatedText"]
    library = Translator(tiny_multi_onnx_dir, batching=BatchLimits(16))
    expected = library.translate(TEXTS[:16], target_lang="zh", beams=2, max_new_tokens=16)
    assert second.json()["translatedText"] == [t.text for t in expected]
    metrics = client.get("/metrics").text
    assert 0 < metric_sample(metrics, "onnxmt_cache_hit_ratio") < 1


def test_other_options_miss_and_alternatives_are_cached_too(client: TestClient) -> None:
    body = {"q": TEXTS[20:22], "target": "zt", "max_new_tokens": 16, "alternatives": 2}
    first = client.post("/translate", json=body).json()
    hits = _counts(client)[0]
    again = client.post("/translate", json=body).json()
    assert again == first and _counts(client)[0] == hits + 2
    other = client.post("/translate", json={**body, "alternatives": 1}).json()
    assert _counts(client)[0] == hits + 2  # a different number of alternatives is a different key
    assert other["translatedText"] == first["translatedText"] and len(other["alternatives"][0]) == 1


def test_cache_size_zero_turns_it_off(tiny_multi_onnx_dir: Path) -> None:
    with TestClient(create_app(tiny_multi_onnx_dir, ServeOptions(cache_size=0))) as off:
        deadline = time.monotonic() + 60
        while off.get("/ready").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        body = {"q": TEXTS[:3], "target": "zh", "max_new_tokens": 8}
        answers = [off.post("/translate", json=body).json() for _ in range(2)]
        assert answers[0] == answers[1]
        assert _counts(off) == (0, 0, 6)  # both requests decoded; nothing counted as a cache lookup
        assert off.get("/info").json()["cache"] == {"size": 0, "entries": 0}
