"""onnxmt's benchmarks: one command, a subcommand each (`bench.py COMMAND --help` for its flags).

    python benchmarks/bench.py --quick                  # the default command, offline, on a tiny model
    python benchmarks/bench.py load MODEL_DIR           # a load test of `onnxmt serve`
    python benchmarks/bench.py probes steps DIR DIR     # one of the small probes

Each command is a module of this folder (COMMANDS), imported only when it runs. Without a command, `offline`
runs: `bench.py --model X` is `bench.py offline --model X`, as the results and docs cite it.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass

DEFAULT = "offline"


@dataclass(frozen=True)
class Command:
    module: str
    summary: str


# In the order `--help` lists them, under their headings.
GROUPS: dict[str, dict[str, Command]] = {
    "engines compared": {
        "offline": Command("offline", "onnxmt against transformers, Optimum, CTranslate2 (default)"),
        "decoder": Command("decoder_bench", "decoder-only: against llama.cpp, onnxruntime-genai, CT2"),
        "ab": Command("ab", "two commits' run side on the same model directories"),
    },
    "memory": {
        "memory": Command("memory", "RSS by phase, each memory setting undone in turn"),
        "big-models": Command("big_models", "peak RSS of export, quantize, validate on a large model"),
        "validate-sides": Command("validate_sides", "validate's two sides apart (big-models' ratios)"),
        "rss-trace": Command("rss_trace", "where an onnxmt command sets its peak RSS"),
    },
    "decoding": {
        "int8-batch": Command("int8_batch", "does batching change a translation?"),
        "encoder-pools": Command("encoder_pools", "the encoder's cost on pools of waiting requests"),
        "probes": Command("probes", "steps, vocab-ops, attention, rss-stages, prefill-chunks"),
    },
    "the service": {
        "load": Command("load", "load test of onnxmt serve at a few concurrency levels"),
        "mixed-load": Command("mixed_load", "short requests beside long ones: latency, fairness"),
        "throughput": Command("service_throughput", "the service's tokens/s against the library's"),
        "limits": Command("limits", "the cost budget, cancellation, SIGTERM"),
        "slow-clients": Command("slow_clients", "sockets that never finish their request"),
        "scale": Command("scale", "Ray's overhead: translate-corpus against the CLI"),
    },
    "documents and text": {
        "documents": Command("documents", "first token and sentence against the whole document"),
        "segment": Command("segment", "sentence segmenters on FLORES-200 paragraphs"),
        "detect": Command("detect", "language detectors on FLORES-200 sentences"),
    },
    "the tests": {
        "mutation": Command("mutation_probe", "small changes to the code: do the tests notice?"),
    },
}
COMMANDS: dict[str, Command] = {name: command for group in GROUPS.values() for name, command in group.items()}


def usage() -> str:
    lines = [
        "usage: python benchmarks/bench.py [COMMAND] [ARGS...]",
        "",
        "onnxmt's benchmarks. `bench.py COMMAND --help` gives a command's flags;",
        f"without a COMMAND, {DEFAULT} runs (`bench.py --quick`, `bench.py --model X`).",
    ]
    for heading, commands in GROUPS.items():
        lines += ["", f"{heading}:"]
        lines += [f"  {name:<15} {command.summary}" for name, command in commands.items()]
    lines += ["", "Setup, every column and the results: benchmarks/README.md"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["-h"], ["--help"], ["help"]):
        print(usage())
        return 0
    if argv and argv[0] in COMMANDS:
        name, argv = argv[0], argv[1:]
    elif argv and not argv[0].startswith("-"):
        print(usage(), file=sys.stderr)
        print(f"\nbench.py: error: unknown command {argv[0]!r}", file=sys.stderr)
        return 2
    else:
        name = DEFAULT
    status = importlib.import_module(COMMANDS[name].module).main(argv)
    return int(status or 0)


if __name__ == "__main__":
    sys.exit(main())
