"""The Markdown table (with ratios to onnxmt) and the PNG chart of a benchmark result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

MB = 1024 * 1024


def _beam_name(beams: int) -> str:
    return "greedy" if beams == 1 else f"beam{beams}"


def metrics(settings: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(column header, key, unit) for every figure, in table order; keys index `flatten()`'s output."""
    cols = [(f"{_beam_name(b)} bs1", f"lat{b}", "ms") for b in settings["beams"]]
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
    if "peak_rss_end_mb" in r:  # results from before it was recorded have no whole-run peak
        out["rss_end"] = r["peak_rss_end_mb"]
    return out


def _fmt(value: float, unit: str) -> str:
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
            if engine is not result["engines"][0] and ref.get(key):
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
        f"outputs of that batch equal to {reference}'s."
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
