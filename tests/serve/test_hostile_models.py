"""What a service's models and its cheapest endpoints do under a hostile client or a broken directory: `/languages`
and `/frontend/settings` made once (pollers cannot load the event loop), a model that fails to load tried again
only after --load-retry-seconds and checked off the inference thread every model shares (its 503 and `/info` show
no server path), and model directories whose sizes or files are hostile refused by `onnxmt serve` in one line
(runtime/dircheck.py; tests/runtime/test_dircheck.py has each case)."""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

import onnxmt.manifest
from onnxmt.serve import catalog
from onnxmt.serve import info as info_module
from onnxmt.serve.app import create_app
from onnxmt.serve.catalog import Catalog
from onnxmt.serve.options import ServeOptions
from tests.helpers.hostile import corrupt_weights, with_external_data_at, with_sizes
from tests.helpers.server import ONNXMT, Server, free_port, server_fixture

EN_ZH = {"q": "Hello world.", "source": "en", "target": "zh", "max_new_tokens": 4}
ZH_EN = {"q": "你好。", "source": "zh", "target": "en", "max_new_tokens": 4}


@contextlib.contextmanager
def serving(model_dirs: list[Path], options: ServeOptions) -> Iterator[str]:
    """The app under uvicorn on a thread of this process (so that a test can watch its functions), until ready."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(model_dirs, options), port=port, log_level="warning"))
    thread = threading.Thread(target=server.run)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                    break
            time.sleep(0.05)
        yield url
    finally:
        server.should_exit = True
        thread.join(30)


# --- /languages and /frontend/settings --------------------------------------------------------------------------


def test_languages_and_frontend_settings_are_made_once(
    tiny_nllb_onnx_dir: Path, tiny_multi_onnx_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = {"languages": 0, "frontend": 0}
    listing, settings = catalog.with_new_codes, info_module.frontend_settings

    def count(name: str, function: Any) -> Any:
        def counted(*args: Any) -> Any:
            made[name] += 1
            return function(*args)

        return counted

    monkeypatch.setattr(catalog, "with_new_codes", count("languages", listing))
    monkeypatch.setattr(info_module, "frontend_settings", count("frontend", settings))
    with serving([tiny_nllb_onnx_dir, tiny_multi_onnx_dir], ServeOptions()) as url:
        answers = [httpx.get(f"{url}/languages", timeout=30).json() for _ in range(10)]
        frontend = [httpx.get(f"{url}/frontend/settings", timeout=30).json() for _ in range(10)]
        info = httpx.get(f"{url}/info", timeout=30).json()
    assert made == {"languages": 1, "frontend": 1}  # at start-up, not per call
    assert all(answer == answers[0] for answer in answers) and all(f == frontend[0] for f in frontend)
    # What a fresh catalog of the same models lists.
    assert len(answers[0]) > 200 and {"en", "zh", "fr"} <= {entry["code"] for entry in answers[0]}
    assert frontend[0]["language"]["source"] == {"code": "auto", "name": "Auto Detect"}
    assert info["routing"]["pair_count"] > 40_000


def test_catalog_lists_once(tiny_multi_onnx_dir: Path, tiny_zh_en_onnx_dir: Path) -> None:
    from onnxmt.runtime.modeldir import load_manifest
    from onnxmt.serve.loading import model_entry

    dirs = (tiny_multi_onnx_dir, tiny_zh_en_onnx_dir)
    entries = [model_entry(d, d.name, load_manifest(d, verify=False)) for d in dirs]
    listed = Catalog(entries, "en")
    assert listed.libretranslate() is listed.libretranslate() and listed.pairs() is listed.pairs()
    assert listed.libretranslate() == Catalog(entries, "en").libretranslate()
    assert listed.frontend_defaults() == ("auto", "zh")


# --- a model that fails to load ----------------------------------------------------------------------------------


@pytest.fixture
def corrupted(tiny_zh_en_onnx_dir: Path, tmp_path: Path) -> Path:
    """zh→en with one byte of its weights changed: its manifest reads, its load fails the sha256 check."""
    copy = Path(shutil.copytree(tiny_zh_en_onnx_dir, tmp_path / "srv-private" / "zh-en"))
    corrupt_weights(copy)
    return copy


def test_a_model_that_fails_to_load_backs_off_and_never_holds_the_inference_thread(
    tiny_multi_onnx_dir: Path, corrupted: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hashing, gate = threading.Event(), threading.Event()
    hashed: list[str] = []
    real = onnxmt.manifest.sha256_file

    def slow_for_the_corrupted_model(path: Path, *args: Any) -> str:
        if corrupted in Path(path).parents:
            hashed.append(threading.current_thread().name)
            hashing.set()
            gate.wait(20)  # a large file's hash
        return real(path, *args)

    monkeypatch.setattr(onnxmt.manifest, "sha256_file", slow_for_the_corrupted_model)
    with serving([tiny_multi_onnx_dir, corrupted], ServeOptions(load_retry_seconds=2, timeout=30, cache_size=0)) as url:
        assert httpx.post(f"{url}/translate", json=EN_ZH, timeout=30).status_code == 200  # en→zh loaded
        answers: list[httpx.Response] = []
        first = threading.Thread(target=lambda: answers.append(httpx.post(f"{url}/translate", json=ZH_EN, timeout=30)))
        first.start()
        assert hashing.wait(20)
        # While the corrupted model's files are hashed, the loaded model answers: the inference thread is free.
        assert httpx.post(f"{url}/translate", json=EN_ZH, timeout=5).status_code == 200
        gate.set()
        first.join(30)
        message = answers[0].json()["error"]
        assert answers[0].status_code == 503 and "sha256 does not match" in message, message
        assert "zh-en" in message and "srv-private" not in message and str(corrupted.parent) not in message
        # Retried only after --load-retry-seconds: meanwhile 503 at once, with the time left, and no hashing.
        calls = len(hashed)
        again = httpx.post(f"{url}/translate", json=ZH_EN, timeout=30)
        assert again.status_code == 503 and again.headers["Retry-After"] == "2" and len(hashed) == calls
        info = httpx.get(f"{url}/info", timeout=30).text
        assert "srv-private" not in info and "sha256 does not match" in info
        time.sleep(2.1)
        assert httpx.post(f"{url}/translate", json=ZH_EN, timeout=30).status_code == 503
        assert len(hashed) > calls  # tried again
    assert "onnxmt-inference" not in " ".join(hashed)


# --- hostile directories: onnxmt serve refuses them in one line --------------------------------------------------


SPOILED: dict[str, tuple[Callable[[Path], None], str]] = {
    "heads": (partial(with_sizes, num_heads=8), "model.num_heads = 8 does not match encoder.onnx's cross_key.0"),
    "positions": (partial(with_sizes, max_positions=-5), "model.max_positions = -5 is outside [1, 2097152]"),
    "external data": (
        partial(with_external_data_at, graph="decoder.onnx", location=b"/etc/passwd"),
        "decoder.onnx: a tensor's external data is outside the model directory; refused",
    ),
}


@pytest.mark.parametrize("case", SPOILED)
def test_serve_refuses_a_hostile_directory_in_one_line(
    tiny_multi_onnx_dir: Path, tiny_zh_en_onnx_dir: Path, tmp_path: Path, case: str
) -> None:
    spoil, message = SPOILED[case]
    copy = Path(shutil.copytree(tiny_zh_en_onnx_dir, tmp_path / "zh-en"))
    spoil(copy)
    command = [*ONNXMT, "serve", str(tiny_multi_onnx_dir), str(copy), "--port", str(free_port())]
    env = {**os.environ, "COLUMNS": "1000"}  # the error on one line
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr.strip().splitlines()[-1] and "Traceback" not in done.stderr, done.stderr


# --- under load: clients polling the listings beside a translating one -------------------------------------------

# NLLB (202 languages, 40,000 pairs) beside a Marian model.
pollers_server = server_fixture("tiny_nllb_onnx_dir", "tiny_multi_onnx_dir", log="hostile-models")


def _latency(url: str, path: str, body: dict[str, Any] | None = None) -> float:
    started = time.perf_counter()
    response = httpx.post(f"{url}{path}", json=body, timeout=60) if body else httpx.get(f"{url}{path}", timeout=60)
    assert response.status_code == 200, response.text
    return time.perf_counter() - started


def test_pollers_of_languages_do_not_slow_translate_or_health(pollers_server: Server) -> None:
    url = pollers_server.url
    body = {**EN_ZH, "source": "en"}
    idle = {"/health": statistics.median(_latency(url, "/health") for _ in range(20))}
    idle["/translate"] = statistics.median(_latency(url, "/translate", body) for _ in range(20))
    polling = True

    def poll(path: str) -> None:
        with httpx.Client(base_url=url, timeout=60) as client:
            while polling:  # a client polling every 20 ms (whose own work stays small on 2 shared cores)
                assert client.get(path).status_code == 200
                time.sleep(0.02)

    pollers = [threading.Thread(target=poll, args=(p,)) for p in ("/languages", "/frontend/settings") * 2]
    for thread in pollers:
        thread.start()
    try:
        time.sleep(0.5)
        busy = {"/health": statistics.median(_latency(url, "/health") for _ in range(20))}
        busy["/translate"] = statistics.median(_latency(url, "/translate", body) for _ in range(20))
    finally:
        polling = False
        for thread in pollers:
            thread.join(60)
    for path in busy:  # four clients polling as fast as they can cost the others little
        assert busy[path] < 3 * idle[path] + 0.02, (path, busy[path], idle[path])
