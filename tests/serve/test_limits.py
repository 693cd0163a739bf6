"""Limits per API key (per client address without one), LibreTranslate's `--req-limit` and `--char-limit` and a
daily character limit, kept in SQLite (serve/limits.py): the key store alone, then real servers and every API."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx
import pytest

from onnxmt.serve.limits import DAY, KeyLimits, KeyStore, LimitExceeded
from onnxmt.serve.protocol import ApiError
from tests.helpers.server import ONNXMT, Server, server_fixture, start_server

KEY, OTHER = "limited-key", "other-key"
WINDOW = 8.0

limited = server_fixture(
    "tiny_multi_onnx_dir", log="limited", api_keys=f"{KEY},{OTHER}", req_limit=5, limit_window=WINDOW, char_limit=100
)
anonymous = server_fixture("tiny_multi_onnx_dir", log="anonymous", req_limit=2, limit_window=3600)


# --- the store ----------------------------------------------------------------------------------------------------


def test_the_sixth_request_in_a_window_is_refused_until_the_next(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "keys.db")
    limits = KeyLimits(req_limit=5)
    for _ in range(5):
        store.charge("key:a", 10, limits, 60, now=120.5)
    with pytest.raises(LimitExceeded, match="5 per 60 seconds") as refused:
        store.charge("key:a", 10, limits, 60, now=150.0)
    assert refused.value.status == 429 and refused.value.headers == {"Retry-After": "30"}
    store.charge("key:b", 10, limits, 60, now=150.0)  # another key has its own count
    store.charge("key:a", 10, limits, 60, now=180.0)  # the next window
    assert store.used_today("key:a", now=180.0) == 60


def test_char_limits_per_request_and_per_day(tmp_path: Path) -> None:
    store = KeyStore(None)
    store.charge("addr:x", 100, KeyLimits(char_limit=100), 60, now=0)
    with pytest.raises(ApiError, match="101 characters, the limit is 100") as refused:
        store.charge("addr:x", 101, KeyLimits(char_limit=100), 60, now=0)
    assert refused.value.status == 400 and not isinstance(refused.value, LimitExceeded)
    daily = KeyLimits(daily_char_limit=250)
    store.charge("addr:y", 200, daily, 60, now=DAY + 10)
    with pytest.raises(LimitExceeded, match="200 of 250 are used") as spent:
        store.charge("addr:y", 51, daily, 60, now=DAY + 20)
    assert spent.value.daily and spent.value.headers["Retry-After"] == str(int(DAY - 20))
    store.charge("addr:y", 50, daily, 60, now=DAY + 30)  # what is left of the day
    store.charge("addr:y", 250, daily, 60, now=2 * DAY)  # a new day


def test_keys_and_counts_survive_reopening(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "keys.db"
    store = KeyStore(path)
    store.add("k", req_limit=2)
    store.charge("key:k", 5, KeyLimits(req_limit=2), 3600, now=10)
    store.charge("key:k", 5, KeyLimits(req_limit=2), 3600, now=11)
    store.close()
    again = KeyStore(path)
    row = again.find("k")
    assert row is not None and row.req_limit == 2 and row.char_limit is None
    with pytest.raises(LimitExceeded):
        again.charge("key:k", 5, KeyLimits(req_limit=2), 3600, now=12)
    assert again.remove("k") and again.find("k") is None and not again.remove("k")


# --- servers ------------------------------------------------------------------------------------------------------


def _requests(server: Server, key: str) -> dict[str, tuple[str, dict[str, object], dict[str, str]]]:
    """One translation request per API: (path, JSON body, headers)."""
    return {
        "libretranslate": ("/translate", {"q": "Hello", "target": "zh", "api_key": key}, {}),
        "deepl": (
            "/v2/translate",
            {"text": ["Hello"], "target_lang": "ZH"},
            {"Authorization": f"DeepL-Auth-Key {key}"},
        ),
        "google": ("/language/translate/v2", {"q": "Hello", "target": "zh"}, {"x-goog-api-key": key}),
        "openai": (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "Hello"}], "target": "zh"},
            {"Authorization": f"Bearer {key}"},
        ),
    }


def _post(server: Server, request: tuple[str, dict[str, object], dict[str, str]]) -> httpx.Response:
    path, body, headers = request
    return httpx.post(f"{server.url}{path}", json=body, headers=headers, timeout=30)


def _window_start() -> None:
    """Sleep into the start of a fresh request window, so that the test's requests share one."""
    time.sleep(WINDOW - time.time() % WINDOW + 0.05)


def test_req_limit_gives_429_with_retry_after_on_every_api(limited: Server) -> None:
    _window_start()
    calls = _requests(limited, KEY)
    for name in ("libretranslate", "deepl", "google", "openai", "libretranslate"):  # five: the limit
        assert _post(limited, calls[name]).status_code == 200, name
    for name, request in calls.items():
        answer = _post(limited, request)
        assert answer.status_code == 429, (name, answer.text)
        assert 1 <= int(answer.headers["Retry-After"]) <= WINDOW
        body = answer.json()
        shapes = {"libretranslate": ("error",), "deepl": ("message",)}
        message = body
        for field in shapes.get(name, ("error", "message")):
            message = message[field]
        assert "Too many requests" in message, name
    assert body["error"]["type"] == "requests"  # OpenAI's shape, last
    assert _post(limited, _requests(limited, OTHER)["deepl"]).status_code == 200  # another key: its own count
    for path in ("/health", "/ready", "/metrics"):  # never limited
        assert httpx.get(f"{limited.url}{path}").status_code == 200
    time.sleep(WINDOW - time.time() % WINDOW + 0.05)  # the next window: counted afresh
    assert _post(limited, calls["google"]).status_code == 200


def test_char_limit_is_per_request(limited: Server) -> None:
    # No wait for a fresh window: OTHER's three requests here and the one of the test above stay under req_limit (5)
    # however the windows fall.
    headers = {"Authorization": f"DeepL-Auth-Key {OTHER}"}
    exact = httpx.post(
        f"{limited.url}/v2/translate", json={"text": ["a" * 60, "b" * 40], "target_lang": "ZH"}, headers=headers
    )
    assert exact.status_code == 200, exact.text
    over = httpx.post(
        f"{limited.url}/v2/translate", json={"text": ["a" * 60, "b" * 41], "target_lang": "ZH"}, headers=headers
    )
    assert over.status_code == 400 and "101 characters, the limit is 100" in over.json()["message"]
    answer = httpx.post(f"{limited.url}/translate", json={"q": "a" * 101, "target": "zh", "api_key": OTHER})
    assert answer.status_code == 400 and "the limit is 100" in answer.json()["error"]


def test_without_keys_each_address_is_counted(anonymous: Server) -> None:
    """Made-up keys make no fresh counts: without keys on, a client is its address."""
    # Windows are aligned to the clock (an hour here): three requests across an hour's end would be in two windows.
    if 3600 - time.time() % 3600 < 10:
        time.sleep(3600 - time.time() % 3600 + 0.5)
    for key in ("a", "b"):
        assert _post(anonymous, _requests(anonymous, key)["deepl"]).status_code == 200
    refused = _post(anonymous, _requests(anonymous, "c")["openai"])
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limit_exceeded"
    # Retry-After: the seconds left in the hour's window, not a minute's.
    assert abs(int(refused.headers["Retry-After"]) - (3600 - time.time() % 3600)) <= 2


def test_keys_in_the_database_and_counts_survive_a_restart(tiny_multi_onnx_dir: Path, tmp_path: Path) -> None:
    db = tmp_path / "keys.db"
    added = subprocess.run(
        [*ONNXMT, "keys", "add", "--key-db", str(db), "--req-limit", "3"], capture_output=True, text=True, check=True
    )
    key = added.stdout.strip()
    assert len(key) >= 24
    settings = {"key_db": db, "limit_window": 3600}
    server = start_server(tiny_multi_onnx_dir, tmp_path, **settings)
    try:
        calls = _requests(server, key)
        assert _post(server, _requests(server, "made-up")["deepl"]).status_code == 403  # keys are on: the database's
        assert httpx.get(f"{server.url}/frontend/settings").json()["keyRequired"] is True
        for name in ("deepl", "google"):
            assert _post(server, calls[name]).status_code == 200, name
    finally:
        assert server.stop() == 0
    server = start_server(tiny_multi_onnx_dir, tmp_path, **settings)
    try:
        assert _post(server, calls["openai"]).status_code == 200  # the third of 3
        assert _post(server, calls["libretranslate"]).status_code == 429  # counted before the restart too
        listed = subprocess.run([*ONNXMT, "keys", "list", "--key-db", str(db)], capture_output=True, text=True)
        assert key in listed.stdout
        subprocess.run([*ONNXMT, "keys", "remove", "--key-db", str(db), key], check=True)
        assert _post(server, calls["google"]).status_code == 403  # removed: at once, while the server runs
    finally:
        assert server.stop() == 0


daily = server_fixture("tiny_multi_onnx_dir", log="daily", daily_char_limit=20)


def test_daily_characters_spent_are_deepls_456_and_usage_says_so(daily: Server) -> None:
    import deepl

    api = deepl.Translator("any", server_url=daily.url)
    api.translate_text("a" * 15, target_lang="ZH")
    usage = api.get_usage()
    assert (usage.character.count, usage.character.limit) == (15, 20)
    with pytest.raises(deepl.QuotaExceededException):
        api.translate_text("b" * 6, target_lang="ZH")
    refused = _post(daily, _requests(daily, "any")["google"])
    assert refused.status_code == 200  # 5 characters: what is left of the day
    refused = _post(daily, _requests(daily, "any")["google"])
    assert refused.status_code == 429 and refused.json()["error"]["status"] == "RESOURCE_EXHAUSTED"
    assert int(refused.headers["Retry-After"]) <= DAY


def test_a_key_database_that_cannot_be_opened_stops_the_server(tiny_multi_onnx_dir: Path, tmp_path: Path) -> None:
    bad = tmp_path / "keys.db"
    bad.write_text("not a database, " * 100)
    command = [*ONNXMT, "serve", str(tiny_multi_onnx_dir), "--port", "0", "--key-db", str(bad)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "cannot open the key database" in done.stderr, done.stderr
