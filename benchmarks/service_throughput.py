"""The service's throughput under many clients against the library's offline throughput, same model and decoding.

    python benchmarks/bench.py throughput MODEL_DIR --target zh              # 32 and 64 clients, beam 4, 3 rounds
    python benchmarks/bench.py throughput MODEL_DIR --target zh --beams 1 --compare ONNXMT_ENCODER_THREADS=2

Offline: one `Translator.translate` call over N texts (batches of `--batch-size`, sorted by length). Service: `onnxmt
serve` on 127.0.0.1 (`--max-batch-size` = `--batch-size`), C clients sending the same N texts one per request, with
the same decoding (`max_new_tokens` `--tokens`: a random model rarely ends a text sooner). Tokens/s count the tokens
generated (the service's from its /metrics counter), so they compare the same work. Rounds interleave offline and
each concurrency; medians are reported, with the load average, and "per round": the median over rounds of each
round's service figure over its offline one (adjacent runs share the machine's speed, which drifts between rounds);
"sustained": the same until the last request is sent, while all C clients are busy (the rest of a service run is
its drain, fewer and fewer clients, which the offline call's equal-length batches do not have).
Where the service's time goes: decoder rows per step, ms per step, and the step share (the running batch's steps'
seconds over the wall clock; the rest is encoding, HTTP and the event loop). Every other round runs the
concurrency levels in reverse order (the machine's speed drifts within a round too). `--compare VAR=VALUE[,...]`
starts a second server with those ONNXMT_* settings and runs it in every round too (each idle while the other
runs; the two take turns first): "compared" rows, and each round's compared figure over the first server's.
Writes benchmarks/results/service-throughput-NAME.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import httpx

import machine
from load import batch_sizes, free_port, run_level, sentences, start_server

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="bench.py throughput", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("model_dir", type=Path)
    p.add_argument("--concurrency", type=int, nargs="+", default=[32, 64])
    p.add_argument("--texts", type=int, default=192)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--beams", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--target", default=None)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--compare", default=None, metavar="VAR=VALUE[,VAR=VALUE]", help="a second server's settings")
    p.add_argument("--name", default=None)
    p.add_argument("--out", type=Path, default=HERE / "results")
    args = p.parse_args(argv)
    from onnxmt import DecodeOptions, RuntimeOptions, Translator

    texts = sentences(args.texts, "en")
    forced = {"beams": args.beams, "max_new_tokens": args.tokens}
    translator = Translator(args.model_dir, RuntimeOptions(threads=args.threads), DecodeOptions(**forced))
    target = translator.target_token(args.target) and args.target
    os.environ.update(
        ONNXMT_MAX_BATCH_SIZE=str(args.batch_size), ONNXMT_THREADS=str(args.threads),
        ONNXMT_BEAMS=str(args.beams), ONNXMT_MAX_NEW_TOKENS=str(args.tokens),
        ONNXMT_MAX_QUEUE="1024", ONNXMT_MAX_TEXTS="64", ONNXMT_TIMEOUT="0",
    )  # fmt: skip
    servers = {"service": _server(args.model_dir, {})}
    if args.compare:
        servers["compared"] = _server(args.model_dir, dict(kv.split("=", 1) for kv in args.compare.split(",")))
    # The sources are English: said, as the offline call knows it (no language detection per request).
    body = {"source": "en", **({"target": target} if target else {})}
    keys = [f"{name} {c}" for c in args.concurrency for name in servers]
    figures: dict[str, list[float]] = {"offline": [], **{key: [] for key in keys}}
    # Where the service's time goes, per concurrency and round: decoder rows per step, and the share of the
    # wall clock spent in the running batch's steps (the rest: encoding, HTTP, the event loop, idle waits).
    shapes: dict[str, list[dict[str, float]]] = {key: [] for key in keys}
    sustained: dict[str, list[float]] = {key: [] for key in keys}
    try:
        translator.translate(texts[:4], target_lang=target)  # warm-up, all sides
        for _, url in servers.values():
            asyncio.run(run_level(url, [body], [texts], 4, 8, 60))
        # What each server runs with, from its /info (the settings of the first model).
        served = {name: httpx.get(f"{url}/info", timeout=10).json()["models"][0] for name, (_, url) in servers.items()}
        running = {name: {k: m[k] for k in ("in_flight", "encoder_threads")} for name, m in served.items()}
        for round_ in range(args.rounds):
            started = time.perf_counter()
            done = translator.translate(texts, target_lang=target, batch_size=args.batch_size)
            figures["offline"].append(sum(len(t.token_ids) for t in done) / (time.perf_counter() - started))
            # Every other round runs the levels and the servers in reverse order: the machine's speed drifts
            # within a round too, and a level always run last would always meet the round's slowest part.
            order = list(servers.items()) if round_ % 2 == 0 else list(servers.items())[::-1]
            levels = args.concurrency if round_ % 2 == 0 else args.concurrency[::-1]
            for concurrency, (name, (_, url)) in ((c, server) for c in levels for server in order):
                before = batch_sizes(url)
                marks: dict[str, Any] = {}
                latencies, errors, elapsed = asyncio.run(
                    run_level(
                        url, [body], [texts], concurrency, len(texts), 600, None, partial(batch_sizes, url), marks
                    )
                )
                if errors or len(latencies) != len(texts):
                    raise SystemExit(f"{name}, {concurrency} clients: {errors}, {len(latencies)} answered")
                after = batch_sizes(url)
                generated = after["generated_tokens"] - before["generated_tokens"]
                figures[f"{name} {concurrency}"].append(generated / elapsed)
                # Sustained: until the last request is sent, while every client is busy (the rest of a run is its
                # drain, fewer and fewer clients: the offline call has no such tail with texts of equal lengths).
                at_last = marks["value"]["generated_tokens"] - before["generated_tokens"]
                sustained[f"{name} {concurrency}"].append(at_last / marks["seconds"])
                steps = after["steps"] - before["steps"]
                shapes[f"{name} {concurrency}"].append({
                    "rows_per_step": (after["step_rows"] - before["step_rows"]) / max(steps, 1),
                    "step_share": (after["step_seconds"] - before["step_seconds"]) / elapsed,
                    "encoder_calls": after["encoder_calls"] - before["encoder_calls"],
                    "ms_per_step": 1000 * (after["step_seconds"] - before["step_seconds"]) / max(steps, 1),
                })  # fmt: skip
    finally:
        for process, _ in servers.values():
            process.send_signal(signal.SIGTERM)
        for process, _ in servers.values():
            process.wait(timeout=120)
    medians = {k: round(statistics.median(v), 1) for k, v in figures.items()}
    result = {
        "settings": {**vars(args), "model_dir": str(args.model_dir), "out": str(args.out)},
        "tokens_per_s": figures,
        "medians": medians,
        "ratios": {k: round(v / medians["offline"], 3) for k, v in medians.items()},
        # Each round's service figure over the offline one measured just before it: the machine's speed drifts
        # between rounds (offline alone moved by 30% between rounds on this 2-core VM), adjacent runs share it.
        "round_ratios": {
            k: [round(a / b, 3) for a, b in zip(v, figures["offline"], strict=True)]
            for k, v in figures.items()
            if k != "offline"
        },
        "sustained_tokens_per_s": sustained,
        # Each round's sustained figure over its offline one.
        "sustained_round_ratios": {
            k: [round(a / b, 3) for a, b in zip(v, figures["offline"], strict=True)] for k, v in sustained.items()
        },
        "shapes": shapes,
        "servers": running,
        "compared_over_service": {
            f"{c} clients": [
                round(a / b, 3) for a, b in zip(figures[f"compared {c}"], figures[f"service {c}"], strict=True)
            ]
            for c in args.concurrency
            if args.compare
        },
        "load_average_end": os.getloadavg(),
        "machine": machine.describe(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"service-throughput-{args.name or args.model_dir.name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(
        "| | tokens/s (median) | / offline | per round | sustained, per round | rows/step | ms/step | step share "
        "| encoder calls |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for key, value in medians.items():
        shape = {k: statistics.median(r[k] for r in shapes[key]) for k in shapes[key][0]} if key in shapes else {}
        cells = [f"{shape[k]:.{d}f}" if shape else "" for k, d in
                 (("rows_per_step", 1), ("ms_per_step", 1), ("step_share", 2), ("encoder_calls", 0))]  # fmt: skip
        rounds = f"{statistics.median(result['round_ratios'][key]):.2f}" if key in shapes else ""
        held = f"{statistics.median(result['sustained_round_ratios'][key]):.2f}" if key in shapes else ""
        print(f"| {key} | {value} | {result['ratios'][key]:.2f} | {rounds} | {held} | " + " | ".join(cells) + " |")
    for c, ratios in result["compared_over_service"].items():
        median = statistics.median(ratios)
        print(f"\ncompared ({args.compare}) over service, {c}: per round {ratios}, median {median:.3f}")
    print(f"\nwrote {path}")


def _server(model_dir: Path, settings: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    """`onnxmt serve MODEL_DIR` on a free port with these ONNXMT_* settings on top of the environment's."""
    saved = dict(os.environ)
    os.environ.update(settings)
    try:
        port = free_port()
        log = Path(tempfile.gettempdir()) / f"onnxmt-throughput-{port}.log"
        process, _ = start_server([model_dir], port, log)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return process, f"http://127.0.0.1:{port}"
