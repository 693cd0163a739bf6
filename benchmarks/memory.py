"""Peak memory (VmHWM) and speed of onnxmt with ONNX Runtime's CPU memory arena on and off, each in a fresh process.

    python benchmarks/memory.py MODEL_DIR [MODEL_DIR ...]

Loads the model, translates a greedy batch of 8, then 64 FLORES sentences with beam 4 at batch 32 (30 forced
tokens, 2 threads): the peak after each phase shows what the largest batch costs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "flores200" / "devtest.eng_Latn"

WORKER = r"""
import json, sys, time
import onnxmt.runtime.graphs as graphs
from onnxmt.runtime.options import RuntimeOptions
from onnxmt.runtime.translator import Translator

plain = graphs.session_options
def with_arena(options):
    so = plain(options)
    so.enable_cpu_mem_arena = sys.argv[2] == "on"
    return so
graphs.session_options = with_arena

def peak_mb():
    line = next(l for l in open("/proc/self/status") if l.startswith("VmHWM"))
    return int(line.split()[1]) // 1024

translator = Translator(sys.argv[1], RuntimeOptions(threads=2, verify=False))
texts = [l.strip() for l in open(sys.argv[3], encoding="utf-8") if l.strip()][:64]
texts.sort(key=lambda t: len(translator.tokenizer.encode(t)))
forced = {"max_new_tokens": 30, "min_new_tokens": 30}
translator.translate(texts[:8], beams=1, batch_size=8, **forced)
after_small = peak_mb()
start = time.perf_counter()
for i in range(0, 64, 32):
    translator.translate(texts[i : i + 32], beams=4, batch_size=32, **forced)
beam = len(texts) * 30 / (time.perf_counter() - start)
start = time.perf_counter()
for text in texts[:10]:
    translator.translate([text], beams=1, **forced)
latency = (time.perf_counter() - start) / 10
print(json.dumps({"peak_after_bs8_mb": after_small, "peak_after_beam4_bs32_mb": peak_mb(),
                  "beam4_bs32_tokens_per_s": round(beam), "greedy_bs1_ms": round(1000 * latency)}))
"""


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    print("| model | arena | peak after bs8 greedy | peak after beam4 bs32 | beam4 bs32 tok/s | greedy bs1 ms |")
    print("| --- | --- | --- | --- | --- | --- |")
    for model in sys.argv[1:]:
        for arena in ("on", "off"):
            cmd = [sys.executable, "-c", WORKER, model, arena, str(DATA)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                print(proc.stderr[-2000:], file=sys.stderr)
                return 1
            r = json.loads(proc.stdout.splitlines()[-1])
            keys = ("peak_after_bs8_mb", "peak_after_beam4_bs32_mb", "beam4_bs32_tokens_per_s", "greedy_bs1_ms")
            cells = [r[k] for k in keys]
            print(f"| {Path(model).name} | {arena} | " + " | ".join(str(c) for c in cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
