"""Limits and failure behaviour of `onnxmt serve`, measured: the cost budget, cancellation, SIGTERM.

    python benchmarks/bench.py limits MODEL_DIR [--timeout 10] [--name NAME]
    python benchmarks/bench.py limits MODEL_DIR --ceiling --name int8-ceiling     # case 4 alone: minutes on 2 cores

Starts `onnxmt serve MODEL_DIR` on a free loopback port for each case, and writes
benchmarks/results/limits/<name>.json with the figures docs/serve.md quotes:

1. the issue's request (16 texts of 5,000 characters, 8 beams, target cmn_Hans; 80 KB) under the default budget:
   status, answer time, server RSS before and peak;
2. the same request with no per-request budget (the per-batch budget alone bounds it): a small request sent 1 s
   after it, when each is answered, and the server's peak RSS (psutil, sampled every 50 ms, and VmHWM);
3. SIGTERM with that request and three more in flight: statuses, and the time from the signal to the exit.
4. (`--ceiling`) the memory ceiling: half the issue's request (8 texts of 5,000 characters, 8 beams: 65,472 tokens
   x beams, one decoder batch at the default budget) run to the end with no timeout; a random model never stops
   early, so every row generates the most tokens the budget allows. The server's peak RSS is the ceiling the
   default budget gives in practice.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

import machine
from load import free_port, rss_mb

HERE = Path(__file__).resolve().parent
ISSUE_REQUEST = {"q": [("The quick brown fox jumps over the lazy dog. " * 112)[:5000]] * 16, "beams": 8}
SMALL = {"q": "Hello world.", "beams": 1, "max_new_tokens": 16}


def serve(model_dir: Path, log: Path, **settings: Any) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    args = [sys.executable, "-m", "onnxmt.cli", "serve", str(model_dir), "--port", str(port), "--no-access-log"]
    for key, value in settings.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    with open(log, "ab") as sink:
        process = subprocess.Popen(args, stdout=sink, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return process, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    process.kill()
    sys.exit(f"the server was not ready; see {log}")


class PeakRss:
    """Samples a process's RSS every 50 ms on a thread."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, self.process.memory_info().rss / 2**20)
            except psutil.Error:
                return
            time.sleep(0.05)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return round(self.peak, 1)


async def timed(client: httpx.AsyncClient, body: dict, start: float) -> dict[str, Any]:
    try:
        response = await client.post("/translate", json={**body, "target": "cmn_Hans"})
        out: dict[str, Any] = {"status": response.status_code, "seconds": round(time.monotonic() - start, 2)}
        if response.status_code != 200:
            out["error"] = response.json().get("error")
        return out
    except httpx.TransportError as e:
        return {"status": None, "transport_error": repr(e), "seconds": round(time.monotonic() - start, 2)}


async def heavy_then_small(url: str, delay: float = 1.0) -> tuple[dict, dict]:
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        start = time.monotonic()
        heavy = asyncio.create_task(timed(client, ISSUE_REQUEST, start))
        await asyncio.sleep(delay)
        small = await timed(client, SMALL, start)
        return await heavy, small


def case(model_dir: Path, log: Path, run: Any, **settings: Any) -> dict[str, Any]:
    process, url = serve(model_dir, log, **settings)
    before = rss_mb(process.pid)
    sampler = PeakRss(process.pid)
    try:
        result = run(process, url)
    finally:
        peak = sampler.stop()
        hwm = rss_mb(process.pid) if process.poll() is None else {}
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(60)
    return {
        "settings": settings,
        "rss_start_mb": before["rss_mb"],
        "rss_peak_mb": peak,
        **result,
        "vm_hwm_mb": hwm.get("peak_rss_mb"),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="bench.py limits", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--name", default="int8")
    parser.add_argument("--ceiling", action="store_true", help="run case 4 (a batch at the full budget) alone")
    a = parser.parse_args(argv)
    log = Path(tempfile.mkdtemp(prefix="onnxmt-limits-")) / "server.log"
    out: dict[str, Any] = {"machine": machine.describe()}
    if a.ceiling:
        out["ceiling"] = case(a.model_dir, log, full_budget_batch, timeout=3600)
        print(json.dumps(out["ceiling"], indent=1), flush=True)
        write(out, a.name)
        return

    def refused(process: subprocess.Popen[bytes], url: str) -> dict[str, Any]:
        heavy, small = asyncio.run(heavy_then_small(url, delay=0.2))
        return {"issue_request": heavy, "small_request": small}

    print("1. the issue's request under the default budget", flush=True)
    out["default_budget"] = case(a.model_dir, log, refused, timeout=a.timeout)
    print(json.dumps(out["default_budget"], indent=1), flush=True)

    print("2. no per-request budget: the batch budget bounds memory, the timeout cancels the work", flush=True)

    def bounded(process: subprocess.Popen[bytes], url: str) -> dict[str, Any]:
        heavy, small = asyncio.run(heavy_then_small(url, delay=1.0))
        return {"issue_request": heavy, "small_request": small}

    out["batch_budget_only"] = case(a.model_dir, log, bounded, timeout=a.timeout, max_request_cost=0)
    print(json.dumps(out["batch_budget_only"], indent=1), flush=True)

    def sigterm(process: subprocess.Popen[bytes], url: str) -> dict[str, Any]:
        async def go() -> tuple[list[dict], float]:
            async with httpx.AsyncClient(base_url=url, timeout=600) as client:
                start = time.monotonic()
                bodies = [ISSUE_REQUEST, *({**SMALL, "q": [SMALL["q"]] * n} for n in (4, 8, 16))]
                tasks = [asyncio.create_task(timed(client, b, start)) for b in bodies]
                await asyncio.sleep(1.0)
                process.send_signal(signal.SIGTERM)
                signalled = time.monotonic()
                results = await asyncio.gather(*tasks)
                return results, signalled

        results, signalled = asyncio.run(go())
        process.wait(120)
        return {
            "requests": results,
            "exit_code": process.returncode,
            "exit_seconds_after_sigterm": round(time.monotonic() - signalled, 2),
        }

    print("3. SIGTERM with the issue's request in flight", flush=True)
    out["sigterm"] = case(a.model_dir, log, sigterm, timeout=a.timeout, max_request_cost=0)
    print(json.dumps(out["sigterm"], indent=1), flush=True)
    write(out, a.name)


def full_budget_batch(process: subprocess.Popen[bytes], url: str) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        async with httpx.AsyncClient(base_url=url, timeout=3600) as client:
            return await timed(client, {**ISSUE_REQUEST, "q": ISSUE_REQUEST["q"][:8]}, time.monotonic())

    metrics = {}
    result = asyncio.run(go())
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("onnxmt_generated_tokens_total", "onnxmt_batch_size_count"):
            metrics[name] = float(value)
    return {"request": result, "metrics": metrics}


def write(out: dict[str, Any], name: str) -> None:
    target = HERE / "results" / "limits" / f"{name}.json"
    target.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {target}")
