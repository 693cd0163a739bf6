"""`onnxmt serve` as a real process on a free loopback port, for the tests that talk to it over HTTP; and what they
read from its answers."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from onnxmt.testing import generate_corpus

TEXTS = generate_corpus(7, lines=64)[0]
# `onnxmt serve ...` with torch, transformers and onnx unimportable: every server in these tests also proves that
# the service needs none of them.
ONNXMT = [
    sys.executable,
    "-c",
    """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers", "onnx"):
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
from onnxmt.cli import main
sys.argv = ["onnxmt", *sys.argv[1:]]
main()
""",
]


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def logs(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise AssertionError(f"the server did not stop on SIGTERM:\n{self.logs()}") from None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(model_dir: Path | list[Path], log_dir: Path, **settings: Any) -> Server:
    """`onnxmt serve MODEL_DIR [MODEL_DIR ...]` with ONNXMT_* settings, once /ready answers 200."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONNXMT_")}
    env.update({f"ONNXMT_{k.upper()}": str(v) for k, v in settings.items()})
    env.setdefault("ONNXMT_ACCESS_LOG", "false")
    log = log_dir / f"server-{port}.log"
    dirs = model_dir if isinstance(model_dir, list) else [model_dir]
    command = [*ONNXMT, "serve", *map(str, dirs), "--host", "127.0.0.1", "--port", str(port)]
    with open(log, "wb") as sink:
        process = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT)
    server = Server(process, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the server exited with {process.returncode}:\n{server.logs()}")
        try:
            if httpx.get(f"{server.url}/ready", timeout=2).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    server.stop()
    raise AssertionError(f"the server was not ready within 60 s:\n{server.logs()}")


def server_fixture(*models: str, log: str, **settings: Any) -> Any:
    """A module-scoped fixture: `onnxmt serve` of the directories the fixtures named `models` give, with ONNXMT_*
    `settings` (start_server), its log in a fresh folder `log`; stopped after the module's tests, and it must then
    exit 0. Assigned to the fixture's name: `keyed = server_fixture("tiny_multi_onnx_dir", log="keyed", ...)`."""

    @pytest.fixture(scope="module")
    def fixture(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
        model_dirs = [request.getfixturevalue(name) for name in models]
        running = start_server(model_dirs, tmp_path_factory.mktemp(log), **settings)
        yield running
        assert running.stop() == 0, running.logs()

    fixture.__doc__ = f"`onnxmt serve {' '.join(models)}` with {settings or 'the default settings'}."
    return fixture


def assert_error(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and isinstance(body["error"], str) and body["error"]
    return str(body["error"])


def metric_sample(text: str, name: str, **labels: str) -> float:
    """One sample of a /metrics page, by name and labels."""
    want = "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else ""
    for line in text.splitlines():
        if line.startswith(f"{name}{want} "):
            return float(line.split()[-1])
    raise AssertionError(f"{name}{want} not in /metrics:\n{text}")
