"""Documents: time to the first token and the first sentence against the whole translation, and a document's
throughput against one `translate` call per sentence, on consecutive FLORES-200 devtest sentences.

A random model with opus-mt-en-zh's architecture translates random tokens, so every sentence is forced to the same
number of new tokens (`--new-tokens`, min = max): all runs do the same decoder work, as in benchmarks/bench.py.
The model directory is one `python benchmarks/bench.py` builds and caches (its `onnxmt-fp32`), or any onnxmt
export.

    python benchmarks/bench.py documents --model benchmarks/.cache/opus-mt-en-zh-random/onnxmt-fp32 \\
        --flores ../shared/data/flores200 --sentences 50 --name documents
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from machine import describe
from onnxmt import BatchLimits, RuntimeOptions, Translator
from onnxmt.documents import translate_document, translate_stream


def document(flores: Path, n: int, per_paragraph: int) -> str:
    lines = [line.strip() for line in (flores / "devtest.eng_Latn").read_text(encoding="utf-8").splitlines()][:n]
    paragraphs = [" ".join(lines[i : i + per_paragraph]) for i in range(0, len(lines), per_paragraph)]
    return "\n\n".join(paragraphs) + "\n"


def timed_stream(translator: Translator, text: str, **overrides: object) -> dict:
    started = time.perf_counter()
    first = None
    pieces = []
    for piece in translate_stream(translator, text, **overrides):
        if first is None and piece.strip():
            first = time.perf_counter() - started
        pieces.append(piece)
    return {
        "first_s": round(first or 0.0, 3),
        "total_s": round(time.perf_counter() - started, 3),
        "text": "".join(pieces),
    }


def measure(translator: Translator, text: str, beams: int, new_tokens: int) -> list[dict]:
    forced: dict[str, Any] = {"beams": beams, "max_new_tokens": new_tokens, "min_new_tokens": new_tokens}
    # A multi-target model translates into its first target language.
    forced["target_lang"] = translator.target_languages[0] if translator.target_languages else None
    from onnxmt.documents.translate import layout

    sentences = [p.text for p in layout(translator, text, target_lang=forced["target_lang"]) if p.translate]
    rows = []
    started = time.perf_counter()
    whole = translate_document(translator, text, **forced)
    took = time.perf_counter() - started
    rows.append({"run": "document, one call (sorted batches)", "first_s": None, "total_s": round(took, 3)})
    started = time.perf_counter()
    for sentence in sentences:
        translator.translate([sentence], **forced)
    rows.append({"run": "one call per sentence", "first_s": None, "total_s": round(time.perf_counter() - started, 3)})
    stream = timed_stream(translator, text, **forced)
    unit = "first token" if beams == 1 else "first sentence"
    rows.append(
        {"run": f"translate_stream (to the {unit})", "first_s": stream["first_s"], "total_s": stream["total_s"]}
    )
    for row in rows:
        row.update(beams=beams, new_tokens=new_tokens, sentences=len(sentences))
        row["sentences_per_s"] = round(len(sentences) / row["total_s"], 2)
    rows[-1]["equal_to_document"] = stream["text"] == whole
    return rows


def markdown(rows: list[dict], info: dict) -> str:
    head = f"CPU: {info.get('cpu', '?')}; {rows[0]['sentences']} FLORES-200 devtest sentences\n\n"
    lines = ["| beams | new tokens | run | first piece s | total s | sentences/s |", "| --- " * 6 + "|"]
    for r in rows:
        first = "" if r["first_s"] is None else f"{r['first_s']:.3f}"
        lines.append(
            f"| {r['beams']} | {r['new_tokens']} | {r['run']} | {first} | {r['total_s']:.3f} | {r['sentences_per_s']} |"
        )
    return head + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench.py documents", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--flores", type=Path, default=Path(__file__).parents[2] / "shared" / "data" / "flores200")
    parser.add_argument("--sentences", type=int, default=50)
    parser.add_argument("--per-paragraph", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--beams", default="1,4")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--name", default="documents", help="results go to benchmarks/results/NAME/")
    args = parser.parse_args(argv)
    translator = Translator(args.model, RuntimeOptions(threads=args.threads), batching=BatchLimits(args.batch_size))
    text = document(args.flores, args.sentences, args.per_paragraph)
    translator.translate(["Warm-up sentence."], max_new_tokens=2)
    rows = []
    for beams in (int(b) for b in args.beams.split(",")):
        rows += measure(translator, text, beams, args.new_tokens)
        for row in rows[-3:]:
            print(json.dumps(row), flush=True)
    info = describe()
    out = Path(__file__).parent / "results" / args.name
    out.mkdir(parents=True, exist_ok=True)
    (out / "documents.json").write_text(
        json.dumps({"machine": info, "settings": vars(args), "rows": rows}, indent=2, default=str) + "\n"
    )
    (out / "documents.md").write_text(markdown(rows, info))
    print(markdown(rows, info))
