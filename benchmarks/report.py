"""The Markdown table (with ratios to onnxmt) and the PNG chart of a benchmark result."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

# The engines each onnxmt decoder-only row is compared with (its bit width's).
INT4_RIVALS = ("llama-q4_0", "llama-q4_k_m", "ortgenai-int4")
INT8_RIVALS = ("llama-q8_0", "ct2-int8", "ortgenai-int8")

MB = 1024 * 1024


def _beam_name(beams: int) -> str:
    return "greedy" if beams == 1 else f"beam{beams}"


def metrics(settings: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(column header, key, unit) for every figure, in table order; keys index `flatten()`'s output."""
    cols = [(f"{_beam_name(b)} bs1", f"lat{b}", "ms") for b in settings["beams"]]
    if settings.get("floor"):  # a greedy step and its ratio to the bandwidth floor (offline.mark_floor_ratios)
        cols += [("greedy step", "step", "ms"), ("× floor", "floor_ratio", "×")]
    cols += [
        (f"{_beam_name(b)} bs{bs}", f"tps{b}x{bs}", "tok/s")
        for b in settings["beams"]
        for bs in settings["batch_sizes"]
    ]
    cols += [("peak RSS", "rss", "MB"), ("peak RSS, whole run", "rss_end", "MB")]
    cols += [("cold start", "cold", "s"), ("on disk", "disk", "MB")]
    return cols


def flatten(engine: dict[str, Any]) -> dict[str, float]:
    """One engine's figures by metric key; empty for an engine that did not run."""
    r = engine.get("result")
    if not r:
        return {}
    out: dict[str, float] = {f"lat{b}": v["median_ms"] for b, v in r["latency"].items()}
    out |= {f"lat{b}_p90": v["p90_ms"] for b, v in r["latency"].items()}
    out |= {f"tps{k}": v["tokens_per_s"] for k, v in r["throughput"].items()}
    out |= {"rss": r["peak_rss_mb"], "cold": r["cold_start_s"], "disk": engine["disk_bytes"] / MB}
    if "step_ms" in r["latency"].get("1", {}):
        out["step"] = r["latency"]["1"]["step_ms"]
    if "floor_ratio" in engine:
        out["floor_ratio"] = engine["floor_ratio"]
    if "peak_rss_end_mb" in r:  # results from before it was recorded have no whole-run peak
        out["rss_end"] = r["peak_rss_end_mb"]
    return out


def _fmt(value: float, unit: str) -> str:
    if unit == "×":
        return f"{value:.2f}×"
    if unit == "s":
        return f"{value:.2f} s"
    if unit == "tok/s":
        return f"{value:.0f}" if value >= 10 else f"{value:.1f}"
    return f"{value:.0f} {unit}" if value >= 10 else f"{value:.1f} {unit}"


def table(result: dict[str, Any]) -> str:
    """Markdown: one row per engine; each cell its value and, in parentheses, value / the first engine's value (onnxmt
    fp32, or onnxmt int8 on an int8-only model)."""
    cols = metrics(result["settings"])
    ref = flatten(result["engines"][0])
    header = "| engine | " + " | ".join(c[0] for c in cols) + " | same tokens |"
    lines = [header, "| --- " * (len(cols) + 2) + "|"]
    for engine in result["engines"]:
        values = flatten(engine)
        if not values:
            lines.append(f"| {engine['label']} | {engine['status']}: {engine.get('error', '')[:80]} |")
            continue
        cells = []
        for _, key, unit in cols:
            if key not in values:
                cells.append("—")
                continue
            cell = _fmt(values[key], unit)
            if key.startswith("lat"):
                cell += f" / {_fmt(values[key + '_p90'], unit)}"
            if engine is not result["engines"][0] and ref.get(key) and unit != "×":
                ratio = values[key] / ref[key]
                cell += f" ({ratio:.2f}×)" if ratio >= 0.1 else f" ({ratio:.3f}×)"
            cells.append(cell)
        same, total = engine.get("agreement", ("?", "?"))
        cells.append(f"{same}/{total}")
        lines.append(f"| {engine['label']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def legend(result: dict[str, Any]) -> str:
    s = result["settings"]
    model = s.get("model_name", "opus-mt-en-zh")
    reference = s.get("reference", "onnxmt fp32")
    languages = f", {s['source_lang']} → {s['target_lang']}" if s.get("source_lang") else ""
    return (
        f"A random model with {model}'s architecture{languages}. "
        f"{s['sentences']} sentences of {s['data_file']} ({s['source_tokens']['min']}–{s['source_tokens']['max']} "
        f"source tokens, median {s['source_tokens']['median']}); exactly {s['max_new_tokens']} new tokens per "
        f"sentence; {s['threads']} threads; {s['repeats']} repeat(s)"
        + (
            f" in each of {s['rounds']} interleaved rounds (every engine in a fresh process per round; each figure the "
            "median of the rounds')"
            if s.get("rounds", 1) > 1
            else ""
        )
        + f". bs1: median / p90 latency per sentence over the "
        f"first {s['latency_sentences']}; bsN: generated tokens/s (beam search counts the returned tokens, not every "
        f"beam's). Peak RSS and cold start: a fresh process that loads the model and translates a batch of "
        f"{s['cold_batch']} (greedy); peak RSS, whole run: the same process's peak at its end, after every column "
        f"(the largest batches set it). (×): the engine's value divided by {reference}'s. Same tokens: greedy "
        f"outputs of that batch equal to {reference}'s." + floor_legend(result)
    )


def floor_legend(result: dict[str, Any]) -> str:
    """The greedy step and floor columns' caption (offline.floors); empty for a run without them."""
    if not result["settings"].get("floor") or not result.get("floors"):
        return ""
    s, bw = result["settings"], result["bandwidth"]
    floors = "; ".join(
        f"{name}: {f['read_per_step'] / 1e6:.1f} MB a step = {f['floor_ms']:.2f} ms"
        for name, f in result["floors"].items()
    )
    return (
        f" Greedy step: a batch-1 decoder step, (time of a sentence's {s['max_new_tokens']} tokens − time of its 1) / "
        f"{s['max_new_tokens'] - 1}, the median over the bs1 sentences. × floor: the step over the floor, the bytes a "
        "greedy batch-1 step reads (the decoder graph's weights: its layers and the head; the embedding is a gather, "
        "the cross-attention keys and values come from the encoder once per sentence) over the memory bandwidth "
        f"measured in the same run (STREAM copy, {s['threads']} threads, {bw['bytes_per_s'] / 1e9:.1f} GB/s, median "
        f"of {len(bw['samples'])}): {floors}; an onnxmt row against its own graph, another engine against onnxmt's "
        "graph of its precision."
    )


def env_table(sizes: dict[str, dict]) -> str:
    lines = ["| environment | site-packages | distributions |", "| --- | --- | --- |"]
    for name, v in sizes.items():
        lines.append(f"| {name} | {v['site_packages_bytes'] / MB:.0f} MB | {v['distributions']} |")
    return "\n".join(lines)


def chart(result: dict[str, Any], path: Path) -> None:
    """One panel per kind of figure, engines as bars in the same order and colours everywhere."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    engines = [e for e in result["engines"] if e.get("result")]
    values = [flatten(e) for e in engines]
    labels = [e["label"] for e in engines]
    colors = plt.get_cmap("tab10").colors
    cols = metrics(result["settings"])
    panels = [
        ("batch-1 latency, median (ms, lower is better)", [c for c in cols if c[2] == "ms"]),
        ("throughput (generated tokens/s, higher is better)", [c for c in cols if c[2] == "tok/s"]),
        ("peak RSS (MB): cold batch, whole run", [c for c in cols if c[1] in ("rss", "rss_end")]),
        ("cold start (s)", [c for c in cols if c[1] == "cold"]),
        ("on disk (MB)", [c for c in cols if c[1] == "disk"]),
    ]
    fig, axes = plt.subplots(2, 3, figsize=(16, 9))
    width = 0.8 / max(1, len(engines))
    for ax, (title, group) in zip(axes.flat, panels, strict=False):
        for i, (label, v) in enumerate(zip(labels, values, strict=True)):
            xs = [g + (i - (len(engines) - 1) / 2) * width for g in range(len(group))]
            ax.bar(xs, [v.get(c[1], 0.0) for c in group], width, label=label, color=colors[i % len(colors)])
        ax.set_xticks(range(len(group)))
        ax.set_xticklabels([c[0] if len(group) > 1 else "" for c in group])
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    handles, names = axes.flat[0].get_legend_handles_labels()
    info = axes.flat[5]
    info.axis("off")
    info.legend(handles, names, loc="upper left", fontsize=9, frameon=False)
    m = result["machine"]
    info.text(
        0,
        0.02,
        f"{m['cpu']}, {m['cores']} cores, SIMD: {' '.join(m['simd'])}\n"
        f"{result['settings']['threads']} threads, {result['settings']['max_new_tokens']} forced tokens, "
        f"{result['settings']['sentences']} sentences\nload average at start: {m['load_average'][0]:.2f}",
        fontsize=8,
        va="bottom",
        transform=info.transAxes,
    )
    model = result["settings"].get("model_name", "opus-mt-en-zh")
    fig.suptitle(f"onnxmt benchmark ({result['mode']}), random {model}-architecture model")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# The decoder-only table (bench.py decoder --model hy-mt1.5-1.8b and the other decoder-only models).
# (header, key, unit, higher is better)
DECODER_COLUMNS = (
    ("prefill 100", "prefill100", "tok/s", True),
    ("prefill 500", "prefill500", "tok/s", True),
    ("decode bs1", "decode", "ms/tok", False),
    ("× floor", "floor_ratio", "×", False),
    ("bs8", "bs8", "tok/s", True),
    ("served, 8 clients", "served", "tok/s", True),
    ("served p50", "served_p50", "s", False),
    ("peak RSS", "rss", "MB", False),
    ("cold start", "cold", "s", False),
    ("on disk", "disk", "MB", False),
)


def decoder_flatten(engine: dict[str, Any], floors: dict[str, Any]) -> dict[str, float]:
    r = engine.get("result")
    if not r:
        return {}
    out = {
        "prefill100": r["prefill_tokens_per_s"]["100"],
        "prefill500": r["prefill_tokens_per_s"]["500"],
        "decode": r["decode_ms_per_token"],
        "bs8": r["batch8_tokens_per_s"],
        "rss": r["peak_rss_mb"],
        "cold": r["cold_start_s"],
        "disk": engine["disk_bytes"] / MB,
    }
    floor = floors.get(str(engine["bits"]))
    if floor:
        out["floor_ratio"] = r["decode_ms_per_token"] / floor["floor_ms"]
    if "served" in engine:
        out["served"] = engine["served"]["tokens_per_s"]
        out["served_p50"] = engine["served"]["p50_s"]
    return out


def _decoder_fmt(value: float, unit: str) -> str:
    if unit == "×":
        return f"{value:.2f}×"
    if unit == "s":
        return f"{value:.2f} s"
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def decoder_table(result: dict[str, Any]) -> str:
    floors = result["floors"]
    header = "| engine | " + " | ".join(f"{c[0]} ({c[2]})" for c in DECODER_COLUMNS) + " | same tokens |"
    lines = [header, "| --- " * (len(DECODER_COLUMNS) + 2) + "|"]
    for engine in result["engines"]:
        values = decoder_flatten(engine, floors)
        if not values:
            lines.append(f"| {engine['label']} | {engine['status']}: {engine.get('error', '')[-100:]} |")
            continue
        cells = [_decoder_fmt(values[key], unit) if key in values else "n/a" for _, key, unit, _ in DECODER_COLUMNS]
        agreement = engine.get("agreement")
        cells.append(
            f"{agreement['same']}/{agreement['outputs']} (prefix {agreement['mean_common_prefix']:.1f})"
            if agreement
            else "—"
        )
        lines.append(f"| {engine['label']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def decoder_targets(result: dict[str, Any], int4: tuple[str, ...], int8: tuple[str, ...]) -> str:
    """The issue's targets: the best onnxmt row of a bit width against each rival of that width, per column; a
    ratio above 1 means onnxmt is ahead by that factor, below 1 behind."""
    floors = result["floors"]
    values = {e["name"]: (e, decoder_flatten(e, floors)) for e in result["engines"]}
    columns = [c for c in DECODER_COLUMNS if c[1] in ("prefill100", "prefill500", "decode", "bs8", "served", "rss")]
    lines = ["| onnxmt row | rival | " + " | ".join(c[0] for c in columns) + " |", "| --- " * (len(columns) + 2) + "|"]
    for bits, rivals in ((4, int4), (8, int8)):
        ours = [(e, v) for e, v in values.values() if e["name"].startswith("onnxmt") and e["bits"] == bits and v]
        if not ours:
            continue
        best_e, best = min(ours, key=lambda ev: ev[1]["decode"])
        for rival in rivals:
            if rival not in values or not values[rival][1]:
                continue
            theirs = values[rival][1]
            cells = []
            for _, key, _, higher in columns:
                if key not in best or key not in theirs:
                    cells.append("n/a")
                    continue
                ratio = best[key] / theirs[key] if higher else theirs[key] / best[key]
                cells.append(f"{ratio:.2f}× {'ahead' if ratio >= 1 else 'behind'}")
            lines.append(f"| {best_e['label']} | {values[rival][0]['label']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def decoder_legend(result: dict[str, Any]) -> str:
    s, bw = result["settings"], result["bandwidth"]
    floors = "; ".join(
        f"{bits}-bit: {f['read_per_step'] / MB:.0f} MB a step ({f['graph']}) = {f['floor_ms']:.1f} ms"
        for bits, f in sorted(result["floors"].items(), key=lambda kv: int(kv[0]))
    )
    loads = [la[0] for la in result["machine"]["load_average_during"]]
    return (
        f"A random model with {s['model_name']}'s architecture, {s['source_lang']} → {s['target_lang']} prompts (its "
        f"chat template around FLORES text, the same ids for every engine). Prefill: prompt tokens / time to the first "
        f"new token, prompts of 100 and 500 tokens. Decode bs1: (time of {s['max_new_tokens']} new tokens − time of "
        f"1) / {s['max_new_tokens'] - 1}, the 100-token prompt. bs8: 8 prompts of 100 tokens, {s['max_new_tokens']} "
        f"new tokens each, generated tokens/s. Every engine greedy, eos suppressed, exactly {s['max_new_tokens']} "
        f"tokens; {s['threads']} threads; each figure the median of {s['repeats']} runs in each of {s['rounds']} "
        f"interleaved rounds (a fresh process per row and round), then the median of the rounds. {served_legend(s)} "
        f"Peak RSS and cold start: a fresh process that loads the model and decodes the 100-token prompt. "
        f"× floor: decode ms/token over the floor of the row's bit width, the bytes a batch-1 step reads from onnxmt's "
        f"graph of that width over the memory bandwidth measured in the same run (STREAM copy, {s['threads']} "
        f"threads, {bw['bytes_per_s'] / 1e9:.1f} GB/s, median of {len(bw['samples'])}): {floors}. Same tokens: greedy "
        f"outputs (the 100-token prompt's and the batch's) equal to the fp32 reference's, and their mean common "
        f"prefix; random weights make near-ties, so int4/int8 rows part ways early. Load average during the run: "
        f"{min(loads):.2f}–{max(loads):.2f} (median {sorted(loads)[len(loads) // 2]:.2f})."
    )


def served_legend(s: dict[str, Any]) -> str:
    """The served column's caption; a run without it (--no-served) says so rather than naming no clients."""
    if s.get("clients") is None:
        return "Served: not measured in this run (--no-served)."
    return (
        f"Served: {s['clients']} concurrent clients, {s.get('serve_requests', 2)} request(s) each, "
        f"{s['max_new_tokens']} new tokens a request, tokens/s over the wall clock and the p50 request latency "
        f"(onnxmt serve; llama-server --parallel; n/a: no server measured)."
    )


def decoder_chart(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    engines = [e for e in result["engines"] if e.get("result")]
    values = [decoder_flatten(e, result["floors"]) for e in engines]
    panels = [c for c in DECODER_COLUMNS if c[1] != "served_p50"]
    fig, axes = plt.subplots(3, 3, figsize=(16, 12))
    colors = plt.get_cmap("tab20").colors
    for ax, (title, key, unit, higher) in zip(axes.flat, panels, strict=False):
        ax.barh(
            range(len(engines)), [v.get(key, 0.0) for v in values], color=[colors[i % 20] for i in range(len(engines))]
        )
        ax.set_yticks(range(len(engines)))
        ax.set_yticklabels([e["label"] for e in engines], fontsize=7)
        ax.invert_yaxis()
        ax.set_title(f"{title} ({unit}, {'higher' if higher else 'lower'} is better)", fontsize=9)
        ax.grid(axis="x", alpha=0.3)
    m = result["machine"]
    fig.suptitle(
        f"onnxmt decoder-only benchmark, random {result['settings']['model_name']}-architecture model; {m['cpu']}, "
        f"{result['settings']['threads']} threads",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_decoder(result: dict[str, Any], stem: Path) -> None:
    """Print the decoder-only tables; write <stem>.json, .md and .png."""
    import json

    stem.parent.mkdir(parents=True, exist_ok=True)
    m = result["machine"]
    text = decoder_table(result) + "\n\n" + decoder_targets(result, INT4_RIVALS, INT8_RIVALS) + "\n\n"
    text += decoder_legend(result) + "\n"
    for name, reason in result["skipped"].items():
        text += f"\nNot measured: {name} ({reason[:300]})."
    versions = ", ".join(f"{k} {v}" for k, v in result["bench_versions"].items() if v)
    text += (
        f"\n\nMachine: {m['cpu']}, {m['cores']} cores, SIMD {' '.join(m['simd'])}; load average "
        f"{m['load_average'][0]:.2f} at start, {m['load_average_end'][0]:.2f} at the end. onnxmt "
        f"{m['git_commit']}, onnxruntime {m['versions'].get('onnxruntime')}; {versions}.\n"
    )
    print(text)
    # The model's name has dots (hy-mt1.5-1.8b): the suffixes are appended, not swapped.
    stem.with_name(stem.name + ".md").write_text(text, encoding="utf-8")
    stem.with_name(stem.name + ".json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    try:
        decoder_chart(result, stem.with_name(stem.name + ".png"))
    except ImportError:
        print("no chart: pip install matplotlib", file=sys.stderr)
