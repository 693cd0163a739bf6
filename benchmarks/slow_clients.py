"""Slow clients against `onnxmt serve`: N sockets that never finish their request, while a normal client keeps
translating. Measures how the normal client fares, and when the server closes the slow sockets.

    python benchmarks/bench.py slow-clients MODEL_DIR --sockets 200 --request-timeout 10

Three kinds of slow socket, a third each: partial headers (one header line, then a byte every second), a body
shorter than its Content-Length (a byte every second), and a connection that sends nothing. Writes
benchmarks/results/slow-clients-NAME.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

KINDS = ("partial headers", "short body", "silent")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="bench.py slow-clients", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--sockets", type=int, default=200)
    parser.add_argument("--request-timeout", type=float, default=10.0)
    parser.add_argument("--max-connections", type=int, default=1000)
    parser.add_argument("--name", default="tiny")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    port = _free_port()
    env = {**os.environ, "ONNXMT_ACCESS_LOG": "false"}
    command = [sys.executable, "-m", "onnxmt.cli", "serve", str(args.model_dir), "--port", str(port)]
    command += ["--request-timeout", str(args.request_timeout), "--max-connections", str(args.max_connections)]
    server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url)
        result = measure(url, port, args.sockets, args.request_timeout)
    finally:
        server.terminate()
        server.wait(60)
    result.update(name=args.name, request_timeout=args.request_timeout, max_connections=args.max_connections)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"slow-clients-{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(_table(result))


def measure(url: str, port: int, count: int, timeout: float) -> dict:
    body = {"q": "Hello world, how are you today?", "max_new_tokens": 8}
    with httpx.Client(base_url=url, timeout=30) as client:
        baseline = [_timed(client, body) for _ in range(20)]
        opened = time.monotonic()
        slow = [_Slow(port, KINDS[i % len(KINDS)]) for i in range(count)]
        for s in slow:
            s.start()
        during: list[float] = []
        errors = 0
        while time.monotonic() - opened < timeout * 0.8:
            try:
                during.append(_timed(client, body))
            except (httpx.HTTPError, AssertionError):
                errors += 1
        for s in slow:
            s.join(timeout * 3 + 10)
    closed = {kind: sorted(s.closed_after for s in slow if s.kind == kind and s.closed_after) for kind in KINDS}
    return {
        "sockets": count,
        "connected": sum(s.connected for s in slow),
        "normal_requests_before": _latency(baseline),
        "normal_requests_during": {**_latency(during), "errors": errors},
        "closed_by_server": {kind: len(v) for kind, v in closed.items()},
        "closed_after_s": {kind: {"min": v[0], "max": v[-1]} for kind, v in closed.items() if v},
        "answers": {kind: sorted({s.answer for s in slow if s.kind == kind}) for kind in KINDS},
    }


class _Slow(threading.Thread):
    """One slow client: connects, starts (or never starts) a request, trickles a byte a second, records when and
    how the server ends it."""

    def __init__(self, port: int, kind: str) -> None:
        super().__init__(daemon=True)
        self.port, self.kind = port, kind
        self.connected = False
        self.closed_after: float | None = None
        self.answer = ""

    def run(self) -> None:
        started = time.monotonic()
        try:
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        except OSError as e:
            self.answer = f"connect failed: {e}"
            return
        self.connected = True
        sock.settimeout(1.0)
        if self.kind == "partial headers":
            sock.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\n")
        elif self.kind == "short body":
            sock.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
        data = b""
        while time.monotonic() - started < 120:
            try:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                data += chunk
            except TimeoutError:
                if self.kind != "silent":
                    try:
                        sock.sendall(b"X-Slow: 1\r\n" if self.kind == "partial headers" else b" ")
                    except OSError:
                        break
            except OSError:
                break
        else:
            sock.close()
            self.answer = "still open after 120 s"
            return
        self.closed_after = round(time.monotonic() - started, 2)
        self.answer = data.split(b"\r\n")[0].decode(errors="replace") or "closed without an answer"
        sock.close()


def _timed(client: httpx.Client, body: dict) -> float:
    started = time.perf_counter()
    response = client.post("/translate", json=body)
    assert response.status_code == 200, response.text
    return (time.perf_counter() - started) * 1000


def _latency(ms: list[float]) -> dict:
    if not ms:
        return {"requests": 0}
    ordered = sorted(ms)
    return {
        "requests": len(ms),
        "p50_ms": round(statistics.median(ordered), 1),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 1),
    }


def _table(r: dict) -> str:
    before, during = r["normal_requests_before"], r["normal_requests_during"]
    lines = [
        f"{r['sockets']} slow sockets ({r['connected']} connected), request timeout {r['request_timeout']:g} s",
        f"normal requests before: {before['requests']}, p50 {before['p50_ms']} ms, p99 {before['p99_ms']} ms",
        f"normal requests during: {during['requests']}, p50 {during.get('p50_ms')} ms, "
        f"p99 {during.get('p99_ms')} ms, errors {during['errors']}",
        "| slow socket | closed by the server | after (s) | answer |",
        "| --- | --- | --- | --- |",
    ]
    for kind in KINDS:
        after = r["closed_after_s"].get(kind, {})
        span = f"{after.get('min')}–{after.get('max')}" if after else "-"
        lines.append(f"| {kind} | {r['closed_by_server'][kind]} | {span} | {', '.join(r['answers'][kind])} |")
    return "\n".join(lines)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(url: str) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise SystemExit("the server was not ready within 120 s")
