"""HY-MT1.5-1.8B int4 (block 128) prefill/decode against llama.cpp Q4_K_M and Q4_0 at the current code
(PREFILL_CHUNK 64), rows interleaved, fresh process per row and round, the prebuilt models (no build step)."""

import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/
import decoder_bench as db
import decoder_models as dm
import models

root = Path("/work/bench-models/hy-mt1.5-1.8b")
model = dm.DECODER_MODELS["hy-mt1.5-1.8b"]
tools = dm.Tools(Path("/work/bench-venv/bin/python"), Path("/work/bench-src/llama_cpp_python-0.3.36/vendor/llama.cpp"))
variants = [
    dm.Variant("onnxmt-int4-b128-a4", "onnxmt int4 b128", "onnxmt", root / "onnxmt-int4-b128-a4", 4),
    dm.Variant("llama-q4_k_m", "llama.cpp Q4_K_M", "llama", root / "gguf" / "model-Q4_K_M.gguf", 4),
    dm.Variant("llama-q4_0", "llama.cpp Q4_0", "llama", root / "gguf" / "model-Q4_0.gguf", 4),
]
texts = models.read_lines(db.DATA / db.INPUT_FILE, 200)
prompts = db.prompt_ids(variants[0].path, texts, model.source_lang, model.target_lang)
config = {
    "prompts": prompts,
    "max_new_tokens": 16,
    "threads": 2,
    "repeats": 2,
    "eos_ids": db.eos_ids(root / "hf"),
    "source_lang": model.source_lang,
    "target_lang": model.target_lang,
}
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
out = {v.name: [] for v in variants}
loads = [os.getloadavg()]
for r in range(rounds):
    for v in variants:
        t = time.monotonic()
        e = db.run_row(v, tools, config, 1800)
        loads.append(os.getloadavg())
        res = e.get("result", {})
        row = {
            "prefill": res.get("prefill_tokens_per_s"),
            "decode": res.get("decode_ms_per_token"),
            "bs8": res.get("batch8_tokens_per_s"),
            "status": e["status"],
            "error": e.get("error", "")[-300:],
        }
        out[v.name].append(row)
        print(r + 1, v.name, row, f"{time.monotonic() - t:.0f}s", flush=True)
summary = {}
for name, rows in out.items():
    ok = [x for x in rows if x["status"] == "ok"]
    summary[name] = {
        "prefill100": statistics.median(x["prefill"]["100"] for x in ok),
        "prefill500": statistics.median(x["prefill"]["500"] for x in ok),
        "decode_ms": statistics.median(x["decode"] for x in ok),
        "bs8": statistics.median(x["bs8"] for x in ok),
    }
print(json.dumps(summary, indent=1))
Path(sys.argv[2] if len(sys.argv) > 2 else "/work/scratch/s57/prefill_recheck.json").write_text(
    json.dumps({"rounds": out, "medians": summary, "loads": loads}, indent=1)
)
