"""Ray's overhead on one machine: `onnxmt translate-corpus` with 1 and 2 workers against the plain CLI.

    python benchmarks/bench.py scale MODEL_DIR                       # 400 FLORES sentences, greedy, 32 new tokens each
    python benchmarks/bench.py scale MODEL_DIR --lines 4000 --rounds 1 --name int8-4000

More lines than FLORES devtest has (1,012) cycle through it again. Each engine also translates `--startup-lines`
lines (8): that run's wall clock is its fixed cost (the process, the model, Ray's local cluster), reported apart,
and the steady rate is the difference: lines / (wall - start-up).

Every engine translates the same sentences with the same settings; a random model rarely stops early, so each
sentence generates exactly `--max-new-tokens` tokens and every engine does the same work. Runs are interleaved
over `--rounds` (the median is reported) and the outputs are compared line by line: Ray must not change a
translation. Wall clock includes each command's start (Ray starts a local cluster: that is part of its overhead).
Prints a Markdown table and writes benchmarks/results/scale/<name>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import machine

HERE = Path(__file__).resolve().parent
FLORES = HERE.parents[1] / "shared" / "data" / "flores200" / "devtest.eng_Latn"


def run(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="bench.py scale", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("model_dir", type=Path)
    p.add_argument("--lines", type=int, default=400)
    p.add_argument("--beams", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--startup-lines", type=int, default=8)
    p.add_argument("--name", default="int8")
    a = p.parse_args(argv)
    cores = os.cpu_count() or 1
    work = Path(tempfile.mkdtemp(prefix="onnxmt-scale-"))
    corpus = work / "corpus.txt"
    flores = FLORES.read_text(encoding="utf-8").splitlines()
    corpus.write_text("\n".join(flores[i % len(flores)] for i in range(a.lines)) + "\n", encoding="utf-8")
    small = work / "startup.txt"
    small.write_text("\n".join(flores[: a.startup_lines]) + "\n", encoding="utf-8")
    onnxmt = [sys.executable, "-m", "onnxmt.cli"]
    flags = ["--beams", str(a.beams), "--max-new-tokens", str(a.max_new_tokens), "-m", str(a.model_dir)]

    def cli(out: Path, source: Path = corpus) -> list[str]:
        return [*onnxmt, "translate", "-i", str(source), "-o", str(out)]

    def ray(workers: int) -> Any:
        return lambda out, source=corpus: [
            *onnxmt,
            "translate-corpus",
            str(source),
            str(out),
            "--workers",
            str(workers),
        ]

    engines: dict[str, Any] = {f"onnxmt translate ({cores} threads)": cli}
    for workers in (1, 2):
        engines[f"translate-corpus, {workers} worker(s) x {max(1, cores // workers)} thread(s)"] = ray(workers)
    times: dict[str, list[float]] = {name: [] for name in engines}
    startup: dict[str, list[float]] = {name: [] for name in engines}
    outputs: dict[str, list[str]] = {}
    for round_ in range(a.rounds):
        for index, (name, command) in enumerate(engines.items()):
            startup[name].append(run([*command(work / f"startup-{index}-{round_}.txt", small), *flags]))
            # A path of its own per engine and round: translate-corpus would resume another run's work directory.
            out = work / f"{index}-{round_}.txt"
            times[name].append(run([*command(out), *flags]))
            outputs[name] = out.read_text(encoding="utf-8").splitlines()
            print(f"round {round_ + 1}: {name}: {times[name][-1]:.1f} s", file=sys.stderr, flush=True)
    reference = outputs[next(iter(engines))]
    base = statistics.median(times[next(iter(engines))])
    first = next(iter(engines))
    steady_base = (a.lines - a.startup_lines) / (base - statistics.median(startup[first]))
    rows = []
    for name in engines:
        wall = statistics.median(times[name])
        fixed = statistics.median(startup[name])
        rows.append(
            {
                "engine": name,
                "wall_s": round(wall, 2),
                "startup_s": round(fixed, 2),
                "steady_sentences_per_s": round((a.lines - a.startup_lines) / max(wall - fixed, 1e-9), 2),
                "sentences_per_s": round(a.lines / wall, 2),
                "tokens_per_s": round(a.lines * a.max_new_tokens / wall, 1),
                "vs_cli": round(base / wall, 2),
                "identical_to_cli": outputs[name] == reference,
                "startup_rounds": [round(t, 2) for t in startup[name]],
                "rounds": [round(t, 2) for t in times[name]],
            }
        )
    result = {"settings": {**vars(a), "model_dir": str(a.model_dir)}, "rows": rows, "machine": machine.describe()}
    target = HERE / "results" / "scale" / f"{a.name}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    for r in rows:
        r["steady_vs_cli"] = round(r["steady_sentences_per_s"] / steady_base, 2)
    target.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print("| engine | wall s | sentences/s | vs the CLI | start-up s | steady sentences/s | steady vs CLI | same |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['engine']} | {r['wall_s']} | {r['sentences_per_s']} | {r['vs_cli']}x | {r['startup_s']} | "
            f"{r['steady_sentences_per_s']} | {r['steady_vs_cli']}x | {'yes' if r['identical_to_cli'] else 'NO'} |"
        )
    print(f"\nwrote {target}")
