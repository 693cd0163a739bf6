"""Mixed traffic against `onnxmt serve`: what a client sending short texts feels while others send long ones.

    python benchmarks/mixed_load.py MODEL_DIR                        # 12 long clients, beam 4, 60 s
    python benchmarks/mixed_load.py MODEL_DIR --long-clients 16 --beams 1 --duration 30

One run, one server (started here on 127.0.0.1 as load.py starts it, stopped with SIGTERM): first the short client
alone (`--idle-requests` requests back to back: its idle latency), then `--long-clients` clients sending texts with
`max_new_tokens` drawn from `--long-tokens` back to back while the short client sends texts with `max_new_tokens`
from `--short-tokens`, for `--duration` seconds. A random model rarely emits its end token, so outputs run to
`max_new_tokens`: the long requests really are long. Prints the short client's p50 and p99, idle and under load,
their ratios, the long clients' generated tokens per second and the decoder rows per step (from /metrics), and
writes benchmarks/results/mixed-load-NAME.json. Inputs: FLORES devtest sentences (generated ones without
../shared/data).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

import machine
from load import client_session, cpu_seconds, free_port, percentile, rss_mb, sentences, start_server

HERE = Path(__file__).resolve().parent


def metrics(url: str) -> dict[str, float]:
    """Sums over the models of the counters this benchmark reads."""
    wanted = ("onnxmt_generated_tokens_total", "onnxmt_step_rows_sum", "onnxmt_step_rows_count")
    out = dict.fromkeys(wanted, 0.0)
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        name, _, value = line.partition(" ")
        name = name.partition("{")[0]
        if name in out:
            out[name] += float(value)
    return out


async def client(
    url: str, texts: list[str], tokens: tuple[int, int], body: dict[str, Any], until: float, count: int, seed: int
) -> list[float]:
    """Requests back to back until `until` (monotonic) or `count` are done; the latencies of those answered 200."""
    rng = random.Random(seed)
    latencies: list[float] = []
    async with client_session(url, 1, timeout=300) as http:
        while time.monotonic() < until and len(latencies) < count:
            fields = {**body, "q": rng.choice(texts), "max_new_tokens": rng.randint(*tokens)}
            started = time.perf_counter()
            async with http.post("/translate", json=fields) as response:
                text = await response.text()
            if response.status != 200:
                raise SystemExit(f"the server answered {response.status}: {text}")
            latencies.append(time.perf_counter() - started)
    return latencies


async def loaded(url: str, texts: list[str], args: argparse.Namespace, body: dict[str, Any]) -> dict[str, Any]:
    until = time.monotonic() + args.duration
    longs = [
        asyncio.create_task(client(url, texts, tuple(args.long_tokens), body, until, 10**9, seed))
        for seed in range(args.long_clients)
    ]
    await asyncio.sleep(args.warmup)  # the long clients fill the running batch first
    short = await client(url, texts, tuple(args.short_tokens), body, until, 10**9, 10**6)
    long_latencies = [x for part in await asyncio.gather(*longs) for x in part]
    return {"short": short, "long": long_latencies}


def describe(latencies: list[float]) -> dict[str, float]:
    return {
        "requests": len(latencies),
        "p50_ms": round(1000 * percentile(latencies, 50), 1),
        "p99_ms": round(1000 * percentile(latencies, 99), 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_dir", type=Path)
    p.add_argument("--long-clients", type=int, default=12)
    p.add_argument("--long-tokens", type=int, nargs=2, default=[48, 60], metavar=("MIN", "MAX"))
    p.add_argument("--short-tokens", type=int, nargs=2, default=[4, 5], metavar=("MIN", "MAX"))
    p.add_argument("--beams", type=int, default=4)
    p.add_argument("--target", default=None, help="target language of a multi-target model, e.g. zh")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of mixed traffic")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds the long clients run before the short one")
    p.add_argument("--idle-requests", type=int, default=30)
    p.add_argument("--name", default=None)
    p.add_argument("--out", type=Path, default=HERE / "results")
    args = p.parse_args()
    body: dict[str, Any] = {"beams": args.beams, **({"target": args.target} if args.target else {})}
    texts = sentences(500, "en")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process, _ = start_server([args.model_dir], port, Path(tempfile.gettempdir()) / f"onnxmt-mixed-{port}.log")
    try:
        asyncio.run(client(url, texts, tuple(args.short_tokens), body, time.monotonic() + 60, 3, 1))  # warm-up
        idle = asyncio.run(client(url, texts, tuple(args.short_tokens), body, time.monotonic() + 300,
                                  args.idle_requests, 2))  # fmt: skip
        before, cpu, load = metrics(url), cpu_seconds(process.pid), os.getloadavg()[0]
        started = time.monotonic()
        mixed = asyncio.run(loaded(url, texts, args, body))
        elapsed = time.monotonic() - started
        after = metrics(url)
        server = rss_mb(process.pid)
        cpu = cpu_seconds(process.pid) - cpu
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=120)
    steps = after["onnxmt_step_rows_count"] - before["onnxmt_step_rows_count"]
    result = {
        "model_dir": str(args.model_dir),
        "settings": {**vars(args), "model_dir": str(args.model_dir), "out": str(args.out)},
        "idle": describe(idle),
        "loaded_short": describe(mixed["short"]),
        "loaded_long": describe(mixed["long"]),
        "generated_tokens_per_s": round(
            (after["onnxmt_generated_tokens_total"] - before["onnxmt_generated_tokens_total"]) / elapsed, 1
        ),
        "rows_per_step": round((after["onnxmt_step_rows_sum"] - before["onnxmt_step_rows_sum"]) / steps, 2)
        if steps
        else None,
        "server_cpu_s": round(cpu, 1),
        "load_average": [round(load, 2), round(os.getloadavg()[0], 2)],
        "server": server,
        "machine": machine.describe(),
    }
    idle_p50 = result["idle"]["p50_ms"]
    result["p50_ratio"] = round(result["loaded_short"]["p50_ms"] / idle_p50, 2)
    result["p99_ratio"] = round(result["loaded_short"]["p99_ms"] / idle_p50, 2)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"mixed-load-{args.name or args.model_dir.name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(
        "| short client | p50 ms | p99 ms | requests |\n| --- | --- | --- | --- |\n"
        f"| idle | {result['idle']['p50_ms']} | {result['idle']['p99_ms']} | {result['idle']['requests']} |\n"
        f"| beside {args.long_clients} long clients | {result['loaded_short']['p50_ms']} | "
        f"{result['loaded_short']['p99_ms']} | {result['loaded_short']['requests']} |\n\n"
        f"p50 {result['p50_ratio']}x, p99 {result['p99_ratio']}x the idle p50; long clients: "
        f"{result['generated_tokens_per_s']} generated tokens/s, {result['rows_per_step']} rows per step; wrote {path}",
        file=sys.stdout,
    )


if __name__ == "__main__":
    main()
