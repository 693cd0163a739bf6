"""The served column of the decoder-only table: `onnxmt serve` or `llama-server --parallel 8` on 127.0.0.1, 8
concurrent clients, each sending its requests back to back: generated tokens/s over the wall clock and the p50
latency of a request; the server's RSS at rest (ready, before any request) and after.

Both servers get the same prompts: onnxmt's a FLORES sentence as text (its template and tokenizer make the
prompt), llama-server's the ids onnxmt makes of the same sentence (`/completion` with a token list). onnxmt stops at
eos as a service does (its tokens are counted from its /metrics); llama-server is told `ignore_eos`, and counts
its own (`tokens_predicted`). Greedy both: the model's generation config has no sampling (decoder_models.build_hf).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

import decoder_models as dm
from load import free_port, rss_mb

HERE = Path(__file__).resolve().parent


def serves(variant: dm.Variant) -> bool:
    """Rows with a server: onnxmt's int8 and first int4 row, llama.cpp's."""
    if variant.kind == "llama":
        return True
    return variant.kind == "onnxmt" and (
        variant.bits == 8 or (variant.bits == 4 and variant.options.get("served", True))
    )


def _start(variant: dm.Variant, tools: dm.Tools, args: Any, port: int, log_file: Path) -> subprocess.Popen[bytes]:
    threads = str(args.threads)
    if variant.kind == "llama":
        assert tools.llama_cpp
        per_slot = 512
        command = [str(tools.llama_cpp / "build" / "bin" / "llama-server"), "-m", str(variant.path)]
        command += ["--host", "127.0.0.1", "--port", str(port), "-t", threads, "-tb", threads]
        command += ["--parallel", str(args.clients), "-c", str(per_slot * args.clients), "--no-webui"]
        env = dict(os.environ)
    else:
        command = [sys.executable, "-m", "onnxmt.cli", "serve", str(variant.path), "--host", "127.0.0.1"]
        command += ["--port", str(port)]
        env = {**os.environ, "PYTHONPATH": str(HERE.parent / "src"), "ONNXMT_THREADS": threads}
        env |= {"ONNXMT_MAX_BATCH_SIZE": str(args.clients), "ONNXMT_CACHE_SIZE": "0", "ONNXMT_ACCESS_LOG": "false"}
        env |= {"ONNXMT_MAX_NEW_TOKENS": str(args.tokens), "ONNXMT_TIMEOUT": "0"}
    with open(log_file, "wb") as sink:
        return subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT)


def wait_ready(process: subprocess.Popen[bytes], url: str, path: str, timeout: float = 600) -> float:
    """Seconds until `url + path` answers 200 (RuntimeError if the server exits or `timeout` passes)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}")
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return time.monotonic() - started
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the server was not ready in time")


def _generated(url: str) -> float:
    """onnxmt's generated-tokens counter, summed over its models."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("onnxmt_generated_tokens_total")
    )


async def _load(url: str, bodies: list[dict[str, Any]], llama: bool, clients: int, each: int) -> dict[str, Any]:
    import aiohttp

    latencies: list[float] = []
    counted: list[int] = []
    path = "/completion" if llama else "/translate"

    async def client(c: int, session: aiohttp.ClientSession) -> None:
        for k in range(each):
            body = bodies[(c * each + k) % len(bodies)]
            started = time.perf_counter()
            async with session.post(path, json=body) as response:
                answer = await response.json()
                if response.status != 200:
                    raise RuntimeError(f"{path} answered {response.status}: {answer}")
            latencies.append(time.perf_counter() - started)
            if llama:
                counted.append(int(answer["tokens_predicted"]))

    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=clients), timeout=timeout) as session:
        started = time.perf_counter()
        await asyncio.gather(*(client(c, session) for c in range(clients)))
        elapsed = time.perf_counter() - started
    return {"latencies": latencies, "elapsed": elapsed, "tokens": sum(counted)}


def measure(
    variant: dm.Variant, tools: dm.Tools, prompts: dict[str, Any], model: dm.DecoderModel, args: Any, log: Any
) -> dict[str, Any]:
    """One server's figures: tokens/s, p50 and p90 latency, RSS at rest and after, seconds to ready."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    llama = variant.kind == "llama"
    log_file = args.decoder_cache / f"serve-{variant.name}.log"
    n = args.tokens
    if llama:
        bodies = [
            {"prompt": ids, "n_predict": n, "ignore_eos": True, "temperature": 0.0, "cache_prompt": False}
            for ids in prompts["served_ids"]
        ]
    else:
        language = {"source": model.source_lang, "target": model.target_lang, "max_new_tokens": n}
        bodies = [{"q": text, **language} for text in prompts["served_texts"]]
    process = _start(variant, tools, args, port, log_file)
    try:
        ready_s = wait_ready(process, url, "/health" if llama else "/ready")
        # Warm-up: one request alone, then the clients' first shapes.
        asyncio.run(_load(url, bodies[:1], llama, 1, 1))
        at_rest = rss_mb(process.pid)
        before = 0.0 if llama else _generated(url)
        figures = asyncio.run(_load(url, bodies, llama, args.clients, args.serve_requests))
        tokens = figures["tokens"] if llama else _generated(url) - before
        after = rss_mb(process.pid)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    latencies = sorted(figures["latencies"])
    return {
        "tokens_per_s": tokens / figures["elapsed"],
        "p50_s": statistics.median(latencies),
        "p90_s": latencies[int(0.9 * (len(latencies) - 1))],
        "requests": len(latencies),
        "tokens": tokens,
        "ready_s": ready_s,
        "rss_at_rest_mb": at_rest["rss_mb"],
        "rss_after_mb": after["rss_mb"],
        "peak_rss_mb": after["peak_rss_mb"],
    }


def merge(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    merged = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    merged["rounds"] = rounds
    return merged
