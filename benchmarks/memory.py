"""Memory of onnxmt's run side, with its memory settings as they are and each one undone, in fresh processes.

    python benchmarks/bench.py memory MODEL_DIR [MODEL_DIR ...]

Variants: `default` (load-time memory given back: `runtime.sessions.release_memory`; ORT's CPU arena on),
`arena off`, `no release`. Each loads the model (RSS and peak after loading), translates a greedy batch of 8 (the
benchmark's peak-RSS column), then 64 FLORES sentences with beam 4 at batch 32 (30 forced tokens, 2 threads) and
10 sentences one by one: the peaks after each phase show what loading and the largest batch cost. The anonymous
columns (`RssAnon`) leave out file-backed pages: the libraries' code and the memory-mapped weights file.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "flores200" / "devtest.eng_Latn"
VARIANTS = ("default", "arena off", "no release")

WORKER = r"""
import json, sys, time
import onnxmt.runtime.graphs as graphs
import onnxmt.runtime.sessions as sessions
from onnxmt.runtime.options import RuntimeOptions
from onnxmt.runtime.translator import Translator

variant = sys.argv[2]
if variant == "arena off":
    plain = sessions.session_options
    def without_arena(options, encoder=False):
        so = plain(options, encoder)
        so.enable_cpu_mem_arena = False
        return so
    sessions.session_options = without_arena
elif variant == "no release":
    graphs.release_memory = lambda directory, trim=True: 0

def mb(key):
    line = next(l for l in open("/proc/self/status") if l.startswith(key))
    return int(line.split()[1]) // 1024

start = time.perf_counter()
translator = Translator(sys.argv[1], RuntimeOptions(threads=2, verify=False))
load_s = time.perf_counter() - start
after_load = {"rss_after_load_mb": mb("VmRSS"), "anon_after_load_mb": mb("RssAnon"), "peak_after_load_mb": mb("VmHWM")}
texts = [l.strip() for l in open(sys.argv[3], encoding="utf-8") if l.strip()][:64]
texts.sort(key=lambda t: len(translator.tokenizer.encode(t)))
forced = {"max_new_tokens": 30, "min_new_tokens": 30}
translator.translate(texts[:8], beams=1, batch_size=8, **forced)
after_small, anon_small = mb("VmHWM"), mb("RssAnon")
start = time.perf_counter()
for i in range(0, 64, 32):
    translator.translate(texts[i : i + 32], beams=4, batch_size=32, **forced)
beam = len(texts) * 30 / (time.perf_counter() - start)
latencies = []
for text in texts[:10]:
    start = time.perf_counter()
    translator.translate([text], beams=1, **forced)
    latencies.append(time.perf_counter() - start)
print(json.dumps({**after_load, "load_s": round(load_s, 2), "peak_after_bs8_mb": after_small,
                  "anon_after_bs8_mb": anon_small,
                  "peak_after_beam4_bs32_mb": mb("VmHWM"), "beam4_bs32_tokens_per_s": round(beam),
                  "greedy_bs1_ms": round(1000 * sorted(latencies)[5])}))
"""

COLUMNS = {
    "rss_after_load_mb": "RSS after load",
    "anon_after_load_mb": "of it anonymous",
    "peak_after_load_mb": "peak after load",
    "load_s": "load s",
    "peak_after_bs8_mb": "peak after bs8 greedy",
    "anon_after_bs8_mb": "anonymous after bs8",
    "peak_after_beam4_bs32_mb": "peak after beam4 bs32",
    "beam4_bs32_tokens_per_s": "beam4 bs32 tok/s",
    "greedy_bs1_ms": "greedy bs1 ms",
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="bench.py memory", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("models", nargs="+", metavar="MODEL_DIR")
    args = p.parse_args(argv)
    print("| model | variant | " + " | ".join(COLUMNS.values()) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in COLUMNS) + " |")
    for model in args.models:
        for variant in VARIANTS:
            cmd = [sys.executable, "-c", WORKER, model, variant, str(DATA)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                print(proc.stderr[-2000:], file=sys.stderr)
                return 1
            r = json.loads(proc.stdout.splitlines()[-1])
            print(f"| {Path(model).name} | {variant} | " + " | ".join(str(r[k]) for k in COLUMNS) + " |")
    return 0
