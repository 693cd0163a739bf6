"""Where each engine's resident memory comes from, stage by stage, in fresh processes: onnxmt and CTranslate2.

    python benchmarks/rss_stages.py MODEL_DIR [MODEL_DIR ...] [--out FILE.md]

A directory with `onnxmt.json` runs on onnxmt's Translator, one with `model.bin` on CTranslate2 (with its
sentencepiece models, as bench.py's worker does). Each process, with 2 threads and 30 forced tokens:

1. imports the engine's packages (onnxmt imports ONNX Runtime when it loads, so for onnxmt ONNX Runtime counts
   under "load");
2. loads the model;
3. translates the first 8 FLORES devtest sentences greedily at batch 8 (bench.py's cold batch: its peak-RSS column);
4. translates the 32 longest of the first 96 sentences with beam 4 at batch 32 (bench.py's largest batch).

For each stage: RSS, its anonymous part, the peak so far (VmHWM), and the mappings that grew most in the stage
(`/proc/self/smaps`: a library's file, `[heap]` for malloc's main heap, `[anon]` for other anonymous memory such
as ONNX Runtime's arenas and large numpy arrays, a model file for its memory-mapped pages).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from probes import emit

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "flores200" / "devtest.eng_Latn"
STAGES = ("import", "load", "greedy bs8", "beam4 bs32")

WORKER = r"""
import collections, json, sys
from pathlib import Path

def status():
    wanted = {"VmRSS": "rss", "RssAnon": "anon", "VmHWM": "peak"}
    return {wanted[k]: int(v.split()[0]) / 1024 for k, v in (l.split(":", 1) for l in open("/proc/self/status"))
            if k in wanted}

def mappings():
    sizes, name = collections.Counter(), "[anon]"
    for line in open("/proc/self/smaps"):
        fields = line.split()
        if not fields[0].endswith(":"):
            name = fields[5].rsplit("/", 1)[-1] if len(fields) > 5 else "[anon]"
        elif fields[0] == "Rss:":
            sizes[name] += int(fields[1]) / 1024
    return sizes

stages, before = [], mappings()
def mark(stage):
    global before
    now = mappings()
    grew = sorted(((k, now[k] - before.get(k, 0)) for k in now), key=lambda kv: -kv[1])
    stages.append({"stage": stage, **status(), "grew": [(k, round(v, 1)) for k, v in grew[:4] if v >= 0.5]})
    before = now

model, data = Path(sys.argv[1]), sys.argv[2]
texts = [l.strip() for l in open(data, encoding="utf-8") if l.strip()][:96]
if (model / "onnxmt.json").is_file():
    from onnxmt.runtime.options import DecodeOptions, RuntimeOptions
    from onnxmt.runtime.translator import Translator
    mark("import")
    tr = Translator(model, RuntimeOptions(threads=2), DecodeOptions(max_new_tokens=30, min_new_tokens=30))
    mark("load")
    length = lambda t: len(tr.tokenizer.encode(t))
    translate = lambda batch, beams: tr.translate(batch, beams=beams, batch_size=len(batch))
else:
    import ctranslate2, sentencepiece as spm
    mark("import")
    tr = ctranslate2.Translator(str(model), device="cpu", intra_threads=2, inter_threads=1)
    source = spm.SentencePieceProcessor(model_file=str(model / "source.spm"))
    target = spm.SentencePieceProcessor(model_file=str(model / "target.spm"))
    mark("load")
    length = lambda t: len(source.encode(t))
    def translate(batch, beams):
        tokens = [[*source.encode(t, out_type=str), "</s>"] for t in batch]
        out = tr.translate_batch(tokens, beam_size=beams, max_decoding_length=30, min_decoding_length=30,
                                 max_batch_size=0)
        return target.decode_pieces([r.hypotheses[0] for r in out])
translate(texts[:8], 1)
mark("greedy bs8")
translate(sorted(texts, key=length)[-32:], 4)
mark("beam4 bs32")
print(json.dumps(stages))
"""


def measure(model: Path, data: Path) -> list[dict]:
    proc = subprocess.run([sys.executable, "-c", WORKER, str(model), str(data)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{model}: the worker failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="+", type=Path)
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--out", type=Path, help="also write the table to this file")
    args = p.parse_args()
    lines = [
        "| model | stage | RSS MB | anonymous MB | peak MB | grew most in the stage (MB) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for model in args.models:
        for s in measure(model, args.data):
            grew = ", ".join(f"{name} +{mb:.1f}" for name, mb in s["grew"])
            lines.append(
                f"| {model.name} | {s['stage']} | {s['rss']:.0f} | {s['anon']:.0f} | {s['peak']:.0f} | {grew} |"
            )
    emit(lines, args.out)


if __name__ == "__main__":
    main()
