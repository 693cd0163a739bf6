"""Load test of `onnxmt serve`: throughput, latency percentiles, errors and server memory at a few concurrency levels.

    python benchmarks/bench.py load MODEL_DIR                          # concurrency 1, 4, 16, 64; 200 requests each
    python benchmarks/bench.py load MODEL_DIR --concurrency 1 8 --requests 100 --duration 30 --max-new-tokens 30
    python benchmarks/bench.py load EN_ZH_DIR ZH_EN_DIR --pair en:zh --pair zh:en   # two models, directions alternating
    python benchmarks/bench.py load MODEL_DIR --concurrency 64 --requests 100000 --output-length median   # real lengths

Starts its own server (`onnxmt serve MODEL_DIR [MODEL_DIR ...]`) on a free port of 127.0.0.1 — traffic never
leaves the machine — and stops it with SIGTERM at the end. Every level is bounded by `--requests` and by
`--duration` seconds, whichever comes first. Server settings come from ONNXMT_* variables as usual (e.g.
ONNXMT_MAX_BATCH_SIZE=32, ONNXMT_MAX_LOADED_MODELS=1); the translation cache is off (ONNXMT_CACHE_SIZE=0) unless
that variable says otherwise, since every level sends the same sentences and would otherwise measure the cache.
With several `--pair SOURCE:TARGET`, request i goes to pair i mod n, with a sentence in its source language. Inputs
are FLORES devtest sentences when ../shared/data is there (eng_Latn for en, zho_Hans for zh), generated sentences
otherwise. Prints a Markdown table and writes benchmarks/results/load-<name>.json.

A random model (all these machines can build) rarely emits its end token, so its outputs run to the length limit
and every request would cost what the longest translation costs. `--output-length` gives real-length outputs:
`median` sends every request `max_new_tokens` = the median source token count (the model's own tokenizer; en->zh
translations are about as long as their sources in tokens), `source` sends each request its own source's count.
With in-flight batching requests of different `max_new_tokens` share decoder calls; a directory served with
static batches (`onnxmt inspect` says which) never mixes them, and there `source` shows what per-request
`max_new_tokens` costs in batching. With several pairs and as many model directories, pair i's sources are counted
with directory i's tokenizer. Generated tokens per second and the server's CPU time per token come from its own
counter (/metrics) and /proc. `texts/batch` is texts per batch (`onnxmt_batch_size`): with in-flight batching, the
texts that joined the running batch at one step; `rows/step` is the running batch's decoder rows per call
(`onnxmt_step_rows`: beams count as rows).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import httpx

import machine

HERE = Path(__file__).resolve().parent
FLORES = Path(__file__).resolve().parents[2] / "shared" / "data" / "flores200"
FLORES_NAMES = {"en": "eng_Latn", "zh": "zho_Hans", "auto": "eng_Latn"}


def sentences(n: int, language: str = "en") -> list[str]:
    """`n` sentences in `language` (a client code: en, zh); generated ones where FLORES has none."""
    path = FLORES / f"devtest.{FLORES_NAMES.get(language, language)}"
    if path.is_file():
        return path.read_text(encoding="utf-8").splitlines()[:n]
    from onnxmt.testing import generate_corpus

    english, chinese = generate_corpus(0, lines=n)
    return chinese if language.startswith("zh") else english


def source_lengths(model_dir: Path, texts: list[str]) -> list[int]:
    """Each text's token count under the model's tokenizer (its end token included), at least 1 and at most what
    the model can generate."""
    from onnxmt.runtime.modeldir import load_manifest
    from onnxmt.tokenization import MarianTokenizer

    tokenizer = MarianTokenizer.from_dir(model_dir)
    most = int(load_manifest(model_dir, verify=False).model["max_positions"]) - 1
    return [min(most, max(1, len(tokenizer.encode(text)))) for text in texts]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (all its threads), from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _summary(lengths: list[int]) -> dict[str, float]:
    return {"median": statistics.median(lengths), "max": max(lengths)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mb(pid: int) -> dict[str, float]:
    """Resident and peak resident memory of a process, from /proc (Linux)."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out["rss_mb" if key == "VmRSS" else "peak_rss_mb"] = round(int(value.split()[0]) / 1024, 1)
    return out


def start_server(model_dirs: list[Path], port: int, log: Path) -> tuple[subprocess.Popen[bytes], float]:
    """The server, and the seconds from its start until /ready answered 200 (its cold start: imports, and the
    model opened; a single model is loaded by then)."""
    env = {**os.environ, "ONNXMT_ACCESS_LOG": os.environ.get("ONNXMT_ACCESS_LOG", "false")}
    env.setdefault("ONNXMT_CACHE_SIZE", "0")
    command = [sys.executable, "-m", "onnxmt.cli", "serve", *map(str, model_dirs)]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    started = time.monotonic()
    with open(log, "wb") as sink:
        process = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"the server exited with {process.returncode}; see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200:
                return process, time.monotonic() - started
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    process.kill()
    sys.exit(f"the server was not ready within 300 s; see {log}")


def client_session(url: str, concurrency: int, timeout: float = 600) -> aiohttp.ClientSession:
    """The load's HTTP client: aiohttp, whose requests cost this process ~0.3 ms of CPU each against httpx's ~1.9 ms
    (measured on 1000 cached /translate requests): the clients share the server's cores, and what they take is
    taken from the server's throughput."""
    connector = aiohttp.TCPConnector(limit=concurrency)
    return aiohttp.ClientSession(url, connector=connector, timeout=aiohttp.ClientTimeout(total=timeout))


async def run_level(
    url: str,
    bodies: list[dict[str, Any]],
    texts: list[list[str]],
    concurrency: int,
    requests: int,
    duration: float,
    lengths: list[list[int]] | None = None,
    at_last_send: Callable[[], Any] | None = None,
    marks: dict[str, Any] | None = None,
):
    """`concurrency` clients sending requests back to back until `requests` are sent or `duration` has passed;
    request i has body i mod len(bodies), with a text of that body's source language (`texts[i mod n]`) and, with
    `lengths`, that text's max_new_tokens. `at_last_send` (with `marks`): called (in a thread) as the last request
    is about to be sent, while every client is still busy; `marks` gets its value and the seconds since the start."""
    latencies: list[float] = []
    errors: dict[str, int] = {}
    sent = 0
    deadline = time.monotonic() + duration

    async def client_loop(client: aiohttp.ClientSession) -> None:
        nonlocal sent
        while sent < requests and time.monotonic() < deadline:
            body, pool = bodies[sent % len(bodies)], texts[sent % len(bodies)]
            index = (sent // len(bodies)) % len(pool)
            fields = {**body, "q": pool[index]}
            if lengths is not None:
                fields["max_new_tokens"] = lengths[sent % len(bodies)][index]
            sent += 1
            if sent == requests and at_last_send is not None and marks is not None:
                marks["seconds"] = time.monotonic() - (deadline - duration)
                marks["value"] = await asyncio.to_thread(at_last_send)
            started = time.perf_counter()
            try:
                async with client.post("/translate", json=fields) as response:
                    await response.read()
                    status = str(response.status)
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                status = type(e).__name__
            if status == "200":
                latencies.append(time.perf_counter() - started)
            else:
                errors[status] = errors.get(status, 0) + 1

    async with client_session(url, concurrency) as client:
        started = time.perf_counter()
        await asyncio.gather(*(client_loop(client) for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return latencies, errors, elapsed


def percentile(values: list[float], q: int) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def summarize(concurrency: int, latencies: list[float], errors: dict[str, int], elapsed: float) -> dict[str, Any]:
    return {
        "concurrency": concurrency,
        "ok": len(latencies),
        "errors": sum(errors.values()),
        "errors_by_status": errors,
        "seconds": round(elapsed, 3),
        "requests_per_s": round(len(latencies) / elapsed, 2),
        "p50_ms": round(percentile(latencies, 50) * 1000, 1),
        "p95_ms": round(percentile(latencies, 95) * 1000, 1),
        "p99_ms": round(percentile(latencies, 99) * 1000, 1),
    }


def batch_sizes(url: str) -> dict[str, float]:
    """Counts so far from /metrics, summed over the models: batches (with in-flight batching, the joins of the
    running batch: requests that joined at one step) with their texts and requests, the running batch's decoder
    steps with their rows, and generated tokens."""
    samples: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        name, _, value = line.partition(" ")
        name = name.partition("{")[0]  # {model="..."}
        if name in (
            "onnxmt_batch_size_sum",
            "onnxmt_batch_size_count",
            "onnxmt_batch_requests_sum",
            "onnxmt_step_rows_sum",
            "onnxmt_step_rows_count",
            "onnxmt_generated_tokens_total",
            "onnxmt_step_duration_seconds_sum",
            "onnxmt_encoder_texts_count",
        ):
            samples[name] = samples.get(name, 0.0) + float(value)
    batches = samples.get("onnxmt_batch_size_count", 0)
    return {
        "batches": batches,
        "texts": samples.get("onnxmt_batch_size_sum", 0),
        "requests": samples.get("onnxmt_batch_requests_sum", 0),
        "steps": samples.get("onnxmt_step_rows_count", 0),
        "step_rows": samples.get("onnxmt_step_rows_sum", 0),
        "generated_tokens": samples.get("onnxmt_generated_tokens_total", 0),
        "step_seconds": samples.get("onnxmt_step_duration_seconds_sum", 0),
        "encoder_calls": samples.get("onnxmt_encoder_texts_count", 0),
    }


def table(levels: list[dict[str, Any]]) -> str:
    head = (
        "| concurrency | requests ok | errors | req/s | tokens/s | p50 ms | p95 ms | p99 ms | texts/batch "
        "| rows/step | server CPU ms/token | load avg | RSS MB after |"
    )
    rows = [head, "|" + " --- |" * 13]
    for r in levels:
        rows.append(
            f"| {r['concurrency']} | {r['ok']} | {r['errors']} | {r['requests_per_s']:.1f} | "
            f"{r['generated_tokens_per_s']:.0f} | {r['p50_ms']:.0f} | {r['p95_ms']:.0f} | {r['p99_ms']:.0f} | "
            f"{r['mean_batch_texts']:.1f} | {r['mean_step_rows']:.1f} | {r['cpu_ms_per_token']} | "
            f"{r['load_average'][1]} | {r['server']['rss_mb']:.0f} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="bench.py load", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("model_dirs", type=Path, nargs="+", metavar="MODEL_DIR", help="passed to onnxmt serve")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--requests", type=int, default=200, help="most requests per concurrency level")
    p.add_argument("--duration", type=float, default=60.0, help="most seconds per concurrency level")
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--beams", type=int, default=None)
    p.add_argument("--target", default=None, help="target language, e.g. cmn_Hans")
    p.add_argument(
        "--pair",
        action="append",
        default=[],
        metavar="SOURCE:TARGET",
        help="a language pair (en:zh); repeat it to alternate requests between pairs (and so between models)",
    )
    p.add_argument(
        "--output-length",
        choices=["limit", "median", "source"],
        default="limit",
        help="limit: outputs may run to --max-new-tokens or the model's limit; median: max_new_tokens = the median "
        "source token count for every request; source: each request's own source token count",
    )
    p.add_argument("--name", default=None, help="results file name: results/load-NAME.json (default: model dir)")
    p.add_argument("--out", type=Path, default=HERE / "results")
    args = p.parse_args(argv)

    fields = {"target": args.target, "beams": args.beams, "max_new_tokens": args.max_new_tokens}
    body: dict[str, Any] = {k: v for k, v in fields.items() if v is not None}
    keys = [k.strip() for k in os.environ.get("ONNXMT_API_KEYS", "").split(",") if k.strip()]
    if keys:
        body["api_key"] = keys[0]  # the server this script starts inherits ONNXMT_API_KEYS
    pairs = [pair.split(":", 1) for pair in args.pair]
    if any(len(pair) != 2 or not all(pair) for pair in pairs):
        p.error("--pair takes SOURCE:TARGET, e.g. en:zh")
    bodies = [{**body, "source": source, "target": target} for source, target in pairs] or [body]
    texts = [sentences(min(max(args.requests, 1), 1000), b.get("source", "en")) for b in bodies]
    lengths = None
    if args.output_length != "limit":
        same = len(args.model_dirs) == len(bodies)
        lengths = [source_lengths(args.model_dirs[i if same else 0], pool) for i, pool in enumerate(texts)]
        if args.output_length == "median":
            lengths = [[int(statistics.median(counts))] * len(counts) for counts in lengths]
    args.out.mkdir(parents=True, exist_ok=True)
    name = args.name or "+".join(d.name for d in args.model_dirs)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process, ready_s = start_server(args.model_dirs, port, Path(tempfile.gettempdir()) / f"onnxmt-load-{port}.log")
    try:
        first = time.monotonic()
        for warm, pool in zip(bodies, texts, strict=True):  # every model loaded before the first level
            httpx.post(f"{url}/translate", json={**warm, "q": pool[0]}, timeout=300).raise_for_status()
        first_request_s = time.monotonic() - first
        server_start = rss_mb(process.pid)
        info = httpx.get(f"{url}/info", params={"api_key": body.get("api_key", "")}, timeout=30).json()
        print(
            f"server pid {process.pid} on {url}: ready in {ready_s:.1f} s, first request(s) {first_request_s:.1f} s, "
            f"RSS at start {server_start['rss_mb']} MB",
            file=sys.stderr,
        )
        levels = []
        for concurrency in args.concurrency:
            before, cpu_before, load_before = batch_sizes(url), cpu_seconds(process.pid), os.getloadavg()[0]
            latencies, errors, elapsed = asyncio.run(
                run_level(url, bodies, texts, concurrency, args.requests, args.duration, lengths)
            )
            after = batch_sizes(url)
            level = summarize(concurrency, latencies, errors, elapsed)
            batches = after["batches"] - before["batches"]
            level["mean_batch_texts"] = round((after["texts"] - before["texts"]) / batches, 2) if batches else 0.0
            steps = after["steps"] - before["steps"]
            # In-flight batching: the running batch's rows per decoder call (0 for static batches).
            level["mean_step_rows"] = round((after["step_rows"] - before["step_rows"]) / steps, 2) if steps else 0.0
            level["mean_batch_requests"] = (
                round((after["requests"] - before["requests"]) / batches, 2) if batches else 0.0
            )
            generated = after["generated_tokens"] - before["generated_tokens"]
            level["generated_tokens_per_s"] = round(generated / elapsed, 1)
            # The server's CPU time per generated token does not depend on what else the machine runs, as wall
            # clock does; the load average says how shared the cores were.
            cpu = cpu_seconds(process.pid) - cpu_before
            level["server_cpu_s"] = round(cpu, 2)
            level["cpu_ms_per_token"] = round(1000 * cpu / generated, 2) if generated else None
            level["load_average"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
            level["server"] = rss_mb(process.pid)
            levels.append(level)
            print(json.dumps(level), file=sys.stderr)
        server_end = rss_mb(process.pid)
    finally:
        process.send_signal(signal.SIGTERM)
        exit_code = process.wait(timeout=120)
    dirs = [str(d) for d in args.model_dirs]
    result = {
        "model_dir": dirs[0] if len(dirs) == 1 else dirs,
        "settings": {**vars(args), "model_dirs": dirs, "out": str(args.out), "body": fields, "pairs": args.pair},
        # The server's settings, less its API keys.
        "server_env": {
            **{"ONNXMT_CACHE_SIZE": "0"},
            **{k: v for k, v in os.environ.items() if k.startswith("ONNXMT_") and k != "ONNXMT_API_KEYS"},
        },
        "ready_s": round(ready_s, 2),
        "first_request_s": round(first_request_s, 2),
        # What /info says of each model: its size, quantization and cost limits.
        "models": [
            {k: m.get(k) for k in ("name", "bytes", "quantization", "cost_limits")} for m in info.get("models", [])
        ],
        "server_rss_start_mb": server_start,
        "server_rss_end_mb": server_end,
        "server_exit_code": exit_code,
        "levels": levels,
        "output_lengths": None if lengths is None else _summary([n for counts in lengths for n in counts]),
        "machine": machine.describe(),
    }
    path = args.out / f"load-{name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(table(levels))
    print(
        f"\nserver ready in {ready_s:.1f} s (first request(s) {first_request_s:.1f} s more); "
        f"server RSS: {server_start['rss_mb']} MB at start, {server_end['rss_mb']} MB at the end "
        f"(peak {server_end['peak_rss_mb']} MB); exit code {exit_code} after SIGTERM; wrote {path}"
    )
