"""Sentence segmenters for onnxmt.documents, measured on FLORES-200 paragraphs.

Paragraphs are built from consecutive devtest sentences (read at run time from the FLORES directory, never copied):
`--per-paragraph` lines joined with a space (English) or with nothing (Chinese, as Chinese text is written). The
true boundaries are where one FLORES line ends and the next begins; a boundary a segmenter puts inside a line counts
against its precision (a few FLORES lines hold two sentences, so no segmenter reaches 100% there), a line boundary it
misses against its recall. Lossless: the share of paragraphs whose pieces join back to the exact text. Speed is
characters per second over all paragraphs, after one warm-up pass.

    python benchmarks/bench.py segment --flores ../shared/data/flores200 --name segment

wtpsplit is not a candidate here: it needs transformers (or its ONNX variant, onnxruntime plus a SaT model) and
downloads its model weights from the hub at first use, which the run side cannot depend on.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Callable
from pathlib import Path

from machine import describe

LANGS = {"eng_Latn": ("en", " "), "zho_Hans": ("zh", "")}
Segmenter = Callable[[str], list[str]]


def _regex(text: str) -> list[str]:
    """The baseline: split after . ! ? 。！？ (and closing quotes) followed by space or by a CJK character."""
    pieces = re.finditer(r".*?(?:[.!?。！？][\"”’」』)]?(?:\s+|(?=[^\x00-\x7f]))|$)", text)
    return [m.group(0) for m in pieces if m.group(0)]


def load(name: str, lang: str) -> Segmenter:
    if name == "regex":
        return _regex
    if name == "pysbd":
        import pysbd

        seg = pysbd.Segmenter(language=lang, clean=False)
        return lambda text: list(seg.segment(text))
    if name == "sentencex":
        from sentencex import segment

        return lambda text: list(segment(lang, text))
    if name == "blingfire":
        import blingfire

        return lambda text: blingfire.text_to_sentences(text).split("\n")
    raise ValueError(f"unknown segmenter {name!r}")


def offsets(text: str, sentences: list[str]) -> set[int]:
    """Where each sentence after the first starts in `text` (segmenters may strip or normalise whitespace)."""
    starts, pos = set(), 0
    for sentence in sentences:
        piece = sentence.strip()
        if not piece:
            continue
        found = text.find(piece, pos)
        if found < 0:  # normalised inside (blingfire folds runs of spaces): find its first word instead
            found = text.find(piece.split()[0], pos)
        if found < 0:
            continue
        starts.add(found)
        pos = found + len(piece.split()[0])
    return starts - {0}


def paragraphs(lines: list[str], per: int, joiner: str) -> list[tuple[str, set[int]]]:
    out = []
    for i in range(0, len(lines) - per + 1, per):
        group = lines[i : i + per]
        text, truth = "", set()
        for line in group:
            if text:
                text += joiner
                truth.add(len(text))
            text += line
        out.append((text, truth))
    return out


def measure(name: str, lang: str, data: list[tuple[str, set[int]]]) -> dict:
    started = time.perf_counter()
    seg = load(name, lang)
    load_s = time.perf_counter() - started
    for text, _ in data[:20]:
        seg(text)
    tp = fp = fn = 0
    started = time.perf_counter()
    predicted = [offsets(text, seg(text)) for text, _ in data]
    took = time.perf_counter() - started
    for (_, truth), pred in zip(data, predicted, strict=True):
        tp += len(truth & pred)
        fp += len(pred - truth)
        fn += len(truth - pred)
    chars = sum(len(t) for t, _ in data)
    # onnxmt.documents rejoins the pieces: a segmenter that drops or folds whitespace loses the layout.
    lossless = sum("".join(seg(text)) == text for text, _ in data) / len(data)
    precision, recall = tp / max(1, tp + fp), tp / max(1, tp + fn)
    return {
        "segmenter": name,
        "lang": lang,
        "precision": round(precision, 4),
        "recall": round(recall, 4),
        "f1": round(2 * precision * recall / max(1e-9, precision + recall), 4),
        "chars_per_s": round(chars / took),
        "load_s": round(load_s, 3),
        "lossless": round(lossless, 3),
    }


def markdown(results: list[dict], per: int, n: int) -> str:
    head = f"FLORES-200 devtest, {n} paragraphs of {per} consecutive sentences per language\n\n"
    rows = ["| segmenter | lang | precision | recall | F1 | chars/s | load s | lossless |", "| --- " * 8 + "|"]
    for r in results:
        if "error" in r:
            rows.append(f"| {r['segmenter']} | {r['lang']} | error: {r['error']} | | | | |")
            continue
        rows.append(
            f"| {r['segmenter']} | {r['lang']} | {r['precision']:.3f} | {r['recall']:.3f} | {r['f1']:.3f} "
            f"| {r['chars_per_s']:,} | {r['load_s']} | {r['lossless']:.0%} |"
        )
    return head + "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench.py segment", description=__doc__.split("\n\n")[0])
    parser.add_argument("--flores", type=Path, default=Path(__file__).parents[2] / "shared" / "data" / "flores200")
    parser.add_argument("--per-paragraph", type=int, default=5)
    parser.add_argument("--segmenters", default="regex,pysbd,sentencex,blingfire")
    parser.add_argument("--name", default="segment", help="results go to benchmarks/results/NAME/")
    args = parser.parse_args(argv)
    results = []
    n = 0
    for suffix, (lang, joiner) in LANGS.items():
        lines = (args.flores / f"devtest.{suffix}").read_text(encoding="utf-8").splitlines()
        data = paragraphs([line.strip() for line in lines if line.strip()], args.per_paragraph, joiner)
        n = len(data)
        for name in args.segmenters.split(","):
            try:
                results.append(measure(name, lang, data))
            except Exception as e:  # a segmenter that fails is a row of the table, not the end of the run
                results.append({"segmenter": name, "lang": lang, "error": f"{type(e).__name__}: {e}"})
            print(json.dumps(results[-1]), flush=True)
    out = Path(__file__).parent / "results" / args.name
    out.mkdir(parents=True, exist_ok=True)
    (out / "segment.json").write_text(json.dumps({"machine": describe(), "results": results}, indent=2) + "\n")
    (out / "segment.md").write_text(markdown(results, args.per_paragraph, n))
    print(markdown(results, args.per_paragraph, n))
