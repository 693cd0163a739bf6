"""The small probes behind figures in docs/performance.md, `bench.py probes PROBE`:

    python benchmarks/bench.py probes steps DIR [DIR ...]      # decoder step and encoder time of directories
    python benchmarks/bench.py probes vocab-ops                # log-softmax and top-k over the vocabulary
    python benchmarks/bench.py probes attention                # separate attention ops against ORT's fused ones
    python benchmarks/bench.py probes rss-stages DIR [DIR ...] # resident memory by stage, onnxmt and CTranslate2
    python benchmarks/bench.py probes prefill-chunks DIR       # a decoder-only prompt's prefill by chunk size

`python benchmarks/bench.py probes PROBE --help` says more. They share interleaved timing (`interleaved`: the calls
take turns, so the machine's drift hits them alike) and their Markdown output (`emit`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import TypeVar

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from onnxmt.runtime.cache import Cache
from onnxmt.runtime.options import RuntimeOptions
from onnxmt.runtime.sessions import load_session
from onnxmt.runtime.translator import Translator, pad_batch
from onnxmt.runtime.vocab import OPS_DIR

K = TypeVar("K")


def interleaved(calls: Mapping[K, Callable[[], object]], repeats: int) -> dict[K, list[float]]:
    """Seconds per call of each of `calls`, `repeats` times, taking turns call by call so that the machine's drift
    hits them alike."""
    times: dict[K, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return times


def emit(lines: list[str], out: Path | None) -> None:
    """Print the table, and write it to `out` too when given."""
    text = "\n".join(lines)
    print(text)
    if out:
        out.write_text(text + "\n", encoding="utf-8")


# --- steps -----------------------------------------------------------------------------------------------------------

STEPS_DOC = """\
Decoder step and encoder time of several model directories, interleaved in one process: what did a graph
change buy?

    python benchmarks/bench.py probes steps DIR [DIR ...] [--rows 1,8,128] [--past 15] [--steps 40]

For each number of rows, each directory's Translator encodes that many FLORES devtest sentences (one row each),
runs `--past` decoder steps to fill the self-attention cache, then times `--steps` more calls of the decoder on
that same cache, and as many calls of the encoder on those sentences, the directories taking turns call by call,
so the machine's drift hits them alike. Prints Markdown tables of the median (and minimum) milliseconds per call.
Unlike ab.py, which compares code on the same model, this compares models (say, one exported before and one after
a change to the exporter) under the same code. A buffered export's cache holds 1, then 4 + 16k positions
(`graphs.next_capacity`): with --past at such a size, every timed call would grow it (15, the default, leaves spare
positions).
"""

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "flores200" / "devtest.eng_Latn"


def filled_cache(translator: Translator, ids: np.ndarray, mask: np.ndarray, past: int) -> tuple[np.ndarray, Cache]:
    """The start token for each row and the decoder cache after `past` steps."""
    graphs = translator.graphs
    cache = graphs.encode(ids, mask)
    tokens = np.full((len(ids), 1), translator.manifest.tokens["decoder_start"], dtype=np.int64)
    for _ in range(past):
        _, cache = graphs.step(tokens, cache)
    return tokens, cache


def _steps(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="bench.py probes steps", description=STEPS_DOC)
    p.add_argument("models", nargs="+", type=Path)
    p.add_argument("--rows", default="1,8,128", help="decoder rows (sentences) per step, comma-separated")
    p.add_argument("--past", type=int, default=15, help="cached positions when timing starts")
    p.add_argument("--steps", type=int, default=40, help="timed steps per directory and row count")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--data", type=Path, default=DATA)
    args = p.parse_args(argv)
    rows_list = [int(r) for r in args.rows.split(",")]
    texts = [line.strip() for line in args.data.read_text(encoding="utf-8").splitlines() if line.strip()]
    translators = [Translator(d, RuntimeOptions(threads=args.threads)) for d in args.models]
    tables: dict[str, list[list[str]]] = {
        "decoder step": [[] for _ in translators],
        "encoder": [[] for _ in translators],
    }
    for rows in rows_list:
        inputs = [
            pad_batch([t.tokenizer.encode(x) for x in texts[:rows]], t.manifest.tokens["pad"]) for t in translators
        ]
        states = [filled_cache(t, ids, mask, args.past) for t, (ids, mask) in zip(translators, inputs, strict=True)]
        calls: dict[tuple[str, int], Callable[[], object]] = {}
        for i, t in enumerate(translators):
            calls["decoder step", i] = partial(t.graphs.step, *states[i])
            calls["encoder", i] = partial(t.graphs.encode, *inputs[i])
        times = interleaved(calls, args.steps)
        for (name, i), ts in times.items():
            tables[name][i].append(f"{1e3 * statistics.median(ts):.2f} ms (min {1e3 * min(ts):.2f})")
    for name, cells in tables.items():
        print(f"\n{name}, per call\n")
        print("| model | " + " | ".join(f"{r} rows" for r in rows_list) + " |")
        print("| --- |" + " --- |" * len(rows_list))
        for model, cell in zip(args.models, cells, strict=True):
            print(f"| {model} | " + " | ".join(cell) + " |")


# --- vocab-ops -------------------------------------------------------------------------------------------------------

VOCAB_OPS_DOC = """\
The vocabulary ops beam search runs at every step, timed side by side: log-softmax, the plain TopK and the
chunked TopK (`runtime/ops/topk_chunked.onnx`) at several chunk lengths.

    python benchmarks/bench.py probes vocab-ops [--vocab 65001] [--out results/vocab_ops.md]

Rows of log-probabilities over opus-mt's 65001 entries, k = 8 (beam search keeps 2 x 4 candidates per row), 2
threads, spinning off. Prints the median milliseconds per call and checks that every variant returns the plain
TopK's indices.
"""

CHUNKS = (47, 141, 461, 1383)  # divisors of 65001


def _vocab_ops(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="bench.py probes vocab-ops", description=VOCAB_OPS_DOC)
    p.add_argument("--vocab", type=int, default=65001)
    p.add_argument("--out", type=Path, help="also write the table here")
    args = p.parse_args(argv)
    options = RuntimeOptions(threads=2)
    log_softmax, plain, chunked = (
        load_session(OPS_DIR / name, options) for name in ("log_softmax.onnx", "topk.onnx", "topk_chunked.onnx")
    )
    chunks = [c for c in CHUNKS if args.vocab % c == 0]
    k = np.array([8], dtype=np.int64)
    lines = [
        f"Milliseconds per call (median), rows of {args.vocab} log-probabilities, k = 8, 2 threads.",
        "",
        "| rows | log-softmax | TopK | " + " | ".join(f"chunked, {c}" for c in chunks) + " |",
        "| --- | --- | --- |" + " --- |" * len(chunks),
    ]
    rng = np.random.default_rng(0)
    for rows in (1, 4, 8, 32, 128):
        logits = (3 * rng.standard_normal((rows, args.vocab))).astype(np.float32)
        scores = log_softmax.run(None, {"logits": logits})[0]
        calls = {
            "log-softmax": lambda logits=logits: log_softmax.run(None, {"logits": logits}),
            "TopK": lambda scores=scores: plain.run(None, {"scores": scores, "k": k}),
        }
        for c in chunks:
            feed = {"scores": scores, "k": k, "chunk": np.array([c], dtype=np.int64)}
            calls[f"chunked {c}"] = lambda feed=feed: chunked.run(None, feed)
        expected = calls["TopK"]()[1]
        for name, call in calls.items():
            if name.startswith("chunked"):
                assert np.array_equal(call()[1], expected), name
        times = interleaved(calls, 40 if rows == 128 else 200)
        lines.append(f"| {rows} | " + " | ".join(f"{1e3 * statistics.median(t):.3f}" for t in times.values()) + " |")
    emit(lines, args.out)


# --- attention -------------------------------------------------------------------------------------------------------

ATTENTION_DOC = """\
One decoder self-attention block at one new token: the separate ops onnxmt's export produces vs ORT's fused
attention ops (com.microsoft), side by side in one process.

    python benchmarks/bench.py probes attention [--out results/attention.md]

8 heads of 64 (opus-mt), 15 cached positions, 2 threads, spinning off. Prints the median time of each at 1, 8 and
128 rows and the largest difference between its outputs and the separate ops'. Used to size the attention-fusion
lever (docs/performance.md):

- `MultiHeadAttention` takes the cache and returns it grown, as the separate ops do (a copy per step);
- `GroupQueryAttention` and `DecoderMaskedMultiHeadAttention` can write the new position into the cache in place:
  the past and present K/V are one preallocated buffer (64 positions here), bound as input and output through I/O
  binding, so no step copies the cache.
"""

HEADS, HEAD_DIM, PAST, CAPACITY = 8, 64, 15, 64
D = HEADS * HEAD_DIM
MS = "com.microsoft"


def session(model) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def value(name: str, shape: list) -> object:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _model(nodes: list, extra_inputs: list, cache_len: str, consts: list | None = None) -> object:
    inputs = [value(n, ["B", 1, D]) for n in "qkv"] + [
        value(n, ["B", HEADS, cache_len, HEAD_DIM]) for n in ("pk", "pv")
    ]
    out_len = "T" if cache_len == "P" else cache_len
    outputs = [value("o", ["B", 1, D])] + [value(n, ["B", HEADS, out_len, HEAD_DIM]) for n in ("nk", "nv")]
    graph = helper.make_graph(nodes, "attention", inputs + extra_inputs, outputs, consts or [])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])


def separate_model() -> object:
    consts = [
        numpy_helper.from_array(np.array([0, -1, HEADS, HEAD_DIM], np.int64), "split"),
        numpy_helper.from_array(np.array([0, -1, D], np.int64), "merge"),
        numpy_helper.from_array(np.array(HEAD_DIM**-0.5, np.float32), "scale"),
    ]
    nodes = []
    for t in "qkv":
        nodes.append(helper.make_node("Reshape", [t, "split"], [t + "4"]))
        nodes.append(helper.make_node("Transpose", [t + "4"], [t + "h"], perm=[0, 2, 1, 3]))
    nodes += [
        helper.make_node("Concat", ["pk", "kh"], ["nk"], axis=2),
        helper.make_node("Concat", ["pv", "vh"], ["nv"], axis=2),
        helper.make_node("Mul", ["qh", "scale"], ["qs"]),
        helper.make_node("Transpose", ["nk"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["qs", "kt"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "nv"], ["oh"]),
        helper.make_node("Transpose", ["oh"], ["ot"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ot", "merge"], ["o"]),
    ]
    return _model(nodes, [], "P", consts)


def mha_model() -> object:
    node = helper.make_node(
        "MultiHeadAttention", ["q", "k", "v", "", "", "", "pk", "pv"], ["o", "nk", "nv"], domain=MS, num_heads=HEADS
    )
    return _model([node], [], "P")


def gqa_model() -> object:
    extra = [
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["B"]),
        helper.make_tensor_value_info("total_len", TensorProto.INT32, []),
    ]
    node = helper.make_node(
        "GroupQueryAttention",
        ["q", "k", "v", "pk", "pv", "seqlens_k", "total_len"],
        ["o", "nk", "nv"],
        domain=MS,
        num_heads=HEADS,
        kv_num_heads=HEADS,
    )
    return _model([node], extra, "M")


def dmmha_model() -> object:
    extra = [helper.make_tensor_value_info("past_len", TensorProto.INT32, [1])]
    node = helper.make_node(
        "DecoderMaskedMultiHeadAttention",
        ["q", "k", "v", "", "", "pk", "pv", "past_len"],
        ["o", "nk", "nv"],
        domain=MS,
        num_heads=HEADS,
        past_present_share_buffer=1,
    )
    return _model([node], extra, "M")


def in_place(sess: ort.InferenceSession, feed: dict, extra: dict) -> Callable[[], np.ndarray]:
    """A call of `sess` with the cache in one (rows, heads, CAPACITY, head_dim) buffer per K and V, bound as both
    the past input and the present output; returns the attention output."""
    rows = len(feed["q"])
    buffers = {}
    for name in ("pk", "pv"):
        buffers[name] = np.zeros((rows, HEADS, CAPACITY, HEAD_DIM), np.float32)
        buffers[name][:, :, :PAST] = feed[name]

    def call() -> np.ndarray:
        io = sess.io_binding()
        for name in "qkv":
            io.bind_cpu_input(name, feed[name])
        for name, array in extra.items():
            io.bind_cpu_input(name, array)
        io.bind_output("o")
        for name, out in (("pk", "nk"), ("pv", "nv")):
            buf = buffers[name]
            io.bind_cpu_input(name, buf)
            io.bind_output(out, "cpu", 0, np.float32, list(buf.shape), buf.ctypes.data)
        sess.run_with_iobinding(io)
        return io.copy_outputs_to_cpu()[0]

    return call


def _attention(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="bench.py probes attention", description=ATTENTION_DOC)
    p.add_argument("--out", type=Path, help="also write the table here")
    args = p.parse_args(argv)
    separate, mha, gqa, dmmha = (session(m) for m in (separate_model(), mha_model(), gqa_model(), dmmha_model()))
    rng = np.random.default_rng(0)
    lines = [
        f"One self-attention block, {HEADS} heads of {HEAD_DIM}, {PAST} cached positions, 2 threads: median time "
        "(and the largest difference from the separate ops' output).",
        "",
        "| rows | separate ops | MultiHeadAttention | GroupQueryAttention, cache in place | "
        "DecoderMaskedMultiHeadAttention, cache in place |",
        "| --- | --- | --- | --- | --- |",
    ]
    for rows in (1, 8, 128):
        feed = {n: rng.standard_normal((rows, 1, D), np.float32) for n in "qkv"}
        feed |= {n: rng.standard_normal((rows, HEADS, PAST, HEAD_DIM), np.float32) for n in ("pk", "pv")}
        reference = separate.run(None, feed)[0]
        calls = {
            "separate": lambda feed=feed: separate.run(None, feed)[0],
            "mha": lambda feed=feed: mha.run(None, feed)[0],
            "gqa": in_place(
                gqa,
                feed,
                {"seqlens_k": np.full(rows, PAST, np.int32), "total_len": np.array(PAST + 1, np.int32)},
            ),
            "dmmha": in_place(dmmha, feed, {"past_len": np.array([PAST], np.int32)}),
        }
        # Each in-place call writes position PAST again, so every timed call does the same work.
        diffs = {name: float(np.abs(call() - reference).max()) for name, call in calls.items()}
        times = interleaved(calls, 200 if rows < 128 else 50)
        cells = [
            f"{1e6 * statistics.median(times[n]):.0f} µs" + (f" ({diffs[n]:.0e})" if n != "separate" else "")
            for n in calls
        ]
        lines.append(f"| {rows} | " + " | ".join(cells) + " |")
    emit(lines, args.out)


# --- rss-stages ------------------------------------------------------------------------------------------------------

RSS_STAGES_DOC = """\
Where each engine's resident memory comes from, stage by stage, in fresh processes: onnxmt and CTranslate2.

    python benchmarks/bench.py probes rss-stages MODEL_DIR [MODEL_DIR ...] [--out FILE.md]

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

STAGES = ("import", "load", "greedy bs8", "beam4 bs32")

WORKER = r"""

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


def _rss_stages(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="bench.py probes rss-stages", description=RSS_STAGES_DOC)
    p.add_argument("models", nargs="+", type=Path)
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--out", type=Path, help="also write the table to this file")
    args = p.parse_args(argv)
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


# --- prefill-chunks --------------------------------------------------------------------------------------------------

PREFILL_CHUNKS_DOC = """\
A decoder-only directory's prefill of one prompt cut into chunks of each size (the chunks take turns, run after
run), and a step of one row after it: the positions per second each chunk size prefills, and a chunk's seconds (what
a running row waits when the service runs a chunk between two steps: runtime/decoder_only.py PREFILL_CHUNK).

    python benchmarks/bench.py probes prefill-chunks DIR [--chunks 256,64,32,16] [--positions 512] [--out F.json]

The prompt is random token ids (the positions' cost does not depend on them).
"""


def _prefill_chunks(argv: list[str]) -> None:
    from machine import describe

    p = argparse.ArgumentParser(prog="bench.py probes prefill-chunks", description=PREFILL_CHUNKS_DOC)
    p.add_argument("model", type=Path)
    p.add_argument("--chunks", default="256,64,32,16", help="chunk sizes, comma-separated")
    p.add_argument("--positions", type=int, default=512, help="the prompt's positions")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    graphs = Translator(args.model, RuntimeOptions(threads=args.threads)).graphs
    prompt = np.random.default_rng(0).integers(100, graphs.vocab_size, args.positions).tolist()
    graphs.prefill_each([prompt[:64]])  # warm-up
    chunks = [int(c) for c in args.chunks.split(",")]
    times = interleaved({c: partial(graphs.prefill_each, [prompt], c) for c in chunks}, args.rounds)
    (cache,) = graphs.prefill_each([prompt])
    step = interleaved({"step": partial(graphs.step, np.array([[5]]), cache)}, 10)["step"]
    rows = []
    print("| chunk | positions/s | s per chunk |\n| --- | --- | --- |")
    for c in chunks:
        seconds = statistics.median(times[c])
        per_chunk = seconds / -(-args.positions // c)
        rows.append({"chunk": c, "seconds": times[c], "positions_per_s": round(args.positions / seconds, 1)})
        rows[-1]["seconds_per_chunk"] = round(per_chunk, 3)
        print(f"| {c} | {args.positions / seconds:.1f} | {per_chunk:.3f} |")
    print(f"\na step of one row after {args.positions} positions: {1e3 * statistics.median(step):.1f} ms")
    if args.out:
        result = {
            "model_dir": str(args.model),
            "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "chunks": rows,
            "step_ms": round(1e3 * statistics.median(step), 1),
            "machine": describe(),
        }
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


COMMANDS: dict[str, Callable[[list[str]], None]] = {
    "steps": _steps,
    "vocab-ops": _vocab_ops,
    "attention": _attention,
    "rss-stages": _rss_stages,
    "prefill-chunks": _prefill_chunks,
}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return
    if not argv or argv[0] not in COMMANDS:
        raise SystemExit(__doc__.split("\n\n")[0] + "\n\nprobes: " + ", ".join(COMMANDS))
    COMMANDS[argv[0]](argv[1:])
