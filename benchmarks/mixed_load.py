"""Mixed traffic against `onnxmt serve`: what a client sending short texts feels while others send long ones.

    python benchmarks/bench.py mixed-load MODEL_DIR                        # 12 long clients, beam 4, 60 s
    python benchmarks/bench.py mixed-load MODEL_DIR --long-clients 16 --beams 1 --duration 30
    python benchmarks/bench.py mixed-load MODEL_DIR --scenario big-request --target zh     # fairness, see below

Scenarios other than `long-clients` measure fairness: a one-text greedy request of `--short-tokens` new tokens
sent back to back (`--short-beams`) while big work runs, again and again: `big-request`, one request of
`--big-texts` texts (greedy, `--big-tokens`); `queued-beams`, three clients each sending a request of 16 texts with
4 beams, so that two of them always wait for a place; `upload`, a `--upload-lines`-line .txt through
/translate_file; `long-prompts` (decoder-only translators: the prompt is prefilled in chunks between steps),
`--prompt-clients` clients each sending one text of about `--prompt-words` words back to back (at 350, prompts of
1,300-1,650 tokens with HY-MT1.5-1.8B's bench directory: run the server with ONNXMT_TIMEOUT=0). Besides the short
client's p50 and max against its idle p50, the big work's own time beside the short client against its time alone
(what fairness costs it).

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

import aiohttp
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


async def big_work(url: str, args: argparse.Namespace, texts: list[str], until: float, count: int) -> list[float]:
    """The scenario's big work, again and again until `until` or `count` are done: the seconds each took."""
    target = {"target": args.target} if args.target else {}
    source = {"source": args.source} if args.source else {}

    async def one(http: Any, seed: int) -> None:
        rng = random.Random(seed)
        if args.scenario == "long-prompts":
            words: list[str] = []
            while len(words) < args.prompt_words:
                words += rng.choice(texts).split()
            body = {"q": " ".join(words[: args.prompt_words]), "max_new_tokens": args.big_tokens, **source, **target}
            async with http.post("/translate", json=body) as response:
                answer = await response.text()
        elif args.scenario == "upload":
            lines = "\n".join(rng.sample(texts, min(args.upload_lines, len(texts))))
            form = aiohttp.FormData(
                {"source": "en", "target": args.target or "zh", "max_new_tokens": str(args.big_tokens)}
            )
            form.add_field("file", lines.encode(), filename="big.txt", content_type="text/plain")
            async with http.post("/translate_file", data=form) as response:
                answer = await response.text()
        else:
            size, beams = (args.big_texts, 1) if args.scenario == "big-request" else (16, 4)
            body = {"q": rng.sample(texts, size), "beams": beams, "max_new_tokens": args.big_tokens, **target}
            async with http.post("/translate", json=body) as response:
                answer = await response.text()
        if response.status != 200:
            raise SystemExit(f"the server answered {response.status}: {answer[:300]}")

    async def loop(seed: int) -> list[float]:
        done: list[float] = []
        async with client_session(url, 1, timeout=900) as http:
            while time.monotonic() < until and len(done) < count:
                started = time.perf_counter()
                await one(http, seed + len(done))
                done.append(time.perf_counter() - started)
        return done

    clients = {"queued-beams": 3, "long-prompts": args.prompt_clients}.get(args.scenario, 1)
    return [x for part in await asyncio.gather(*(loop(1000 * i) for i in range(clients))) for x in part]


async def fairness(url: str, texts: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """The short client beside the scenario's big work for `--duration` seconds."""
    until = time.monotonic() + args.duration
    big = asyncio.create_task(big_work(url, args, texts, until, 10**9))
    await asyncio.sleep(args.warmup)  # the big work is running (or queued) first
    short_body = {"beams": args.short_beams, **languages(args)}
    short = await client(url, texts, tuple(args.short_tokens), short_body, until, 10**9, 10**6)
    return {"short": short, "big": await big}


def languages(args: argparse.Namespace) -> dict[str, str]:
    """The request's language fields the options give."""
    return {k: v for k, v in (("source", args.source), ("target", args.target)) if v}


def describe(latencies: list[float]) -> dict[str, float]:
    return {
        "requests": len(latencies),
        "p50_ms": round(1000 * percentile(latencies, 50), 1),
        "p99_ms": round(1000 * percentile(latencies, 99), 1),
        "max_ms": round(1000 * max(latencies), 1),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="bench.py mixed-load", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("model_dir", type=Path)
    p.add_argument("--long-clients", type=int, default=12)
    p.add_argument("--long-tokens", type=int, nargs=2, default=[48, 60], metavar=("MIN", "MAX"))
    p.add_argument("--short-tokens", type=int, nargs=2, default=[4, 5], metavar=("MIN", "MAX"))
    p.add_argument("--beams", type=int, default=4)
    p.add_argument("--target", default=None, help="target language of a multi-target model, e.g. zh")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of mixed traffic")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds the long clients run before the short one")
    p.add_argument("--idle-requests", type=int, default=30)
    p.add_argument(
        "--scenario",
        choices=["long-clients", "big-request", "queued-beams", "upload", "long-prompts"],
        default="long-clients",
    )
    p.add_argument("--source", default=None, help="source language, for models that need one (TranslateGemma)")
    p.add_argument("--prompt-clients", type=int, default=8, help="long-prompts: clients sending long texts")
    p.add_argument("--prompt-words", type=int, default=350, help="long-prompts: words per long text")
    p.add_argument("--short-beams", type=int, default=1, help="fairness scenarios: the short client's beams")
    p.add_argument("--big-texts", type=int, default=64, help="big-request: texts in the big request")
    p.add_argument("--big-tokens", type=int, default=48, help="big-request, queued-beams: its new tokens")
    p.add_argument("--upload-lines", type=int, default=640, help="upload: lines of the .txt")
    p.add_argument("--big-alone", type=int, default=3, help="fairness scenarios: runs of the big work alone")
    p.add_argument("--name", default=None)
    p.add_argument("--out", type=Path, default=HERE / "results")
    args = p.parse_args(argv)
    body: dict[str, Any] = {"beams": args.beams, **languages(args)}
    texts = sentences(500, "en")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process, _ = start_server([args.model_dir], port, Path(tempfile.gettempdir()) / f"onnxmt-mixed-{port}.log")
    fair = args.scenario != "long-clients"
    if fair:
        body = {"beams": args.short_beams, **languages(args)}
    try:
        asyncio.run(client(url, texts, tuple(args.short_tokens), body, time.monotonic() + 60, 3, 1))  # warm-up
        idle = asyncio.run(client(url, texts, tuple(args.short_tokens), body, time.monotonic() + 300,
                                  args.idle_requests, 2))  # fmt: skip
        big_alone = asyncio.run(big_work(url, args, texts, time.monotonic() + 600, args.big_alone)) if fair else []
        before, cpu, load = metrics(url), cpu_seconds(process.pid), os.getloadavg()[0]
        started = time.monotonic()
        mixed = asyncio.run(fairness(url, texts, args) if fair else loaded(url, texts, args, body))
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
        "loaded_long": describe(mixed["big" if fair else "long"]),
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
    result["max_ratio"] = round(result["loaded_short"]["max_ms"] / idle_p50, 2)
    if fair:
        result["big_alone"] = describe(big_alone)
        result["big_ratio"] = round(result["loaded_long"]["p50_ms"] / result["big_alone"]["p50_ms"], 2)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"mixed-load-{args.name or args.model_dir.name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    if fair:
        print(
            f"| {args.scenario} | idle p50 ms | p50 ms | max ms | p50 / idle | max / idle | big work p50 s: alone, "
            f"beside | ratio |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n| short client | "
            f"{idle_p50} | {result['loaded_short']['p50_ms']} | {result['loaded_short']['max_ms']} | "
            f"{result['p50_ratio']}x | {result['max_ratio']}x | {result['big_alone']['p50_ms'] / 1000:.2f}, "
            f"{result['loaded_long']['p50_ms'] / 1000:.2f} | {result['big_ratio']}x |\n\n"
            f"{result['loaded_short']['requests']} short requests, {result['loaded_long']['requests']} big; wrote "
            f"{path}"
        )
        return
    print(
        "| short client | p50 ms | p99 ms | requests |\n| --- | --- | --- | --- |\n"
        f"| idle | {result['idle']['p50_ms']} | {result['idle']['p99_ms']} | {result['idle']['requests']} |\n"
        f"| beside {args.long_clients} long clients | {result['loaded_short']['p50_ms']} | "
        f"{result['loaded_short']['p99_ms']} | {result['loaded_short']['requests']} |\n\n"
        f"p50 {result['p50_ratio']}x, p99 {result['p99_ratio']}x the idle p50; long clients: "
        f"{result['generated_tokens_per_s']} generated tokens/s, {result['rows_per_step']} rows per step; wrote {path}",
        file=sys.stdout,
    )
