"""Two versions of onnxmt's run side, side by side in one run: how much did a change buy?

    python benchmarks/bench.py ab HEAD~1 HEAD MODEL_DIR [MODEL_DIR ...]

Each git ref's `src/` is extracted to a temporary folder and runs in its own fresh process on the same model
directories and inputs (FLORES devtest, decoding forced to --tokens new tokens, 2 threads), alternating A and B for
--repeats rounds; the best round of each is kept, since background load only ever makes a run slower. Prints a
Markdown table (batch-1 latency in ms, batches in generated tokens/s, the process's peak RSS in MB, the lowest of
the rounds) and writes results/ab.json. `--source-lang`/`--target-lang` for models that need them (NLLB).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE.parents[1] / "shared" / "data" / "flores200" / "devtest.eng_Latn"
CASES = ((1, 1), (1, 32), (4, 8), (4, 32))  # (beams, batch size)

WORKER = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from onnxmt.runtime.options import RuntimeOptions
from onnxmt.runtime.translator import Translator

model, data, tokens, threads, sentences = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
translator = Translator(model, RuntimeOptions(threads=threads, verify=False))
texts = [line.strip() for line in open(data, encoding="utf-8") if line.strip()][:sentences]
texts.sort(key=lambda t: len(translator.tokenizer.encode(t)))
forced = {"max_new_tokens": tokens, "min_new_tokens": tokens, **json.loads(sys.argv[8])}
translator.translate(texts[:2], beams=1, **forced)
out = {}
for beams, batch in json.loads(sys.argv[7]):
    n = min(len(texts), 10) if batch == 1 else len(texts)
    start = time.perf_counter()
    for i in range(0, n, batch):
        translator.translate(texts[i : i + batch], beams=beams, batch_size=batch, **forced)
    seconds = time.perf_counter() - start
    out[f"beam{beams} bs{batch}"] = 1000 * seconds / n if batch == 1 else n * tokens / seconds
out["peak MB"] = next(int(l.split()[1]) / 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(json.dumps(out))
"""


def extract(ref: str, into: Path) -> Path:
    archive = subprocess.run(["git", "archive", ref, "src"], cwd=HERE.parent, capture_output=True, check=True)
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def measure(src: Path, model: str, args: argparse.Namespace) -> dict[str, float]:
    cmd = [sys.executable, "-c", WORKER, str(src), model, str(args.data), str(args.tokens), str(args.threads)]
    languages = {k: v for k, v in (("source_lang", args.source_lang), ("target_lang", args.target_lang)) if v}
    cmd += [str(args.sentences), json.dumps(CASES), json.dumps(languages)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{src} on {model} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.splitlines()[-1])


def _unit(key: str) -> str:
    return "MB" if key == "peak MB" else "ms" if key.endswith("bs1") else "tok/s"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="bench.py ab", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("ref_a")
    p.add_argument("ref_b")
    p.add_argument("models", nargs="+")
    p.add_argument("--tokens", type=int, default=30)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--sentences", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--out", type=Path, default=HERE / "results" / "ab.json")
    p.add_argument("--source-lang", help="for models that need it (NLLB: eng_Latn)")
    p.add_argument("--target-lang", help="for multi-target models (NLLB: zho_Hans)")
    args = p.parse_args(argv)
    if not args.data.is_file():
        print(f"error: {args.data} not found; pass --data", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        srcs = {ref: extract(ref, Path(tmp) / f"v{i}") for i, ref in enumerate((args.ref_a, args.ref_b))}
        best: dict[tuple[str, str], dict[str, float]] = {}
        for _ in range(args.repeats):
            for model in args.models:
                for ref, src in srcs.items():
                    got = measure(src, model, args)
                    old = best.setdefault((ref, model), got)
                    for key, value in got.items():  # latency and memory: lower is better; throughput: higher
                        old[key] = max(old[key], value) if "tok/s" in _unit(key) else min(old[key], value)
    keys = [*(f"beam{b} bs{n}" for b, n in CASES), "peak MB"]
    print("| model | version | " + " | ".join(keys) + " |")
    print("| --- | --- |" + " --- |" * len(keys))
    for (ref, model), values in best.items():
        cells = [f"{values[k]:.0f} {_unit(k)}" for k in keys]
        print(f"| {Path(model).name} | {ref} | " + " | ".join(cells) + " |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"ref": ref, "model": model, **values} for (ref, model), values in best.items()]
    args.out.write_text(json.dumps({"tokens": args.tokens, "threads": args.threads, "rows": rows}, indent=1))
    return 0
