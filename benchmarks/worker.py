"""One engine, measured in a fresh process: `python worker.py CONFIG.json RESULT.json`; `launch` starts it.

`bench.py offline` starts this script once per engine, with the interpreter of the environment the engine lives in (the
Optimum rows run in a venv with transformers 4.57), so it imports nothing but the standard library at the top and
the engine's own packages inside the adapter. Every engine gets the same texts, in the same batches, with decoding
forced to exactly `max_new_tokens` steps, and `threads` intra-op threads.

Order of work: import + load + translate the first `cold_batch` texts (greedy) -> cold start and peak RSS, as a user
starting a process sees them; then batch-1 latency per sentence and batched throughput, after one warm-up call each.

The protocol (a config file in, a result file out: `launch` in the parent, `run_from_argv` in the child) and the
process's own figures (`peak_rss_mb`, `versions`) serve decoder_worker.py too.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

# Translate a batch with `beams` beams and exactly `n` new tokens (detokenizing, as a user would); return each
# text's generated token ids (the best hypothesis, after the decoder start token, up to and including eos).
TranslateFn = Callable[[Sequence[str], int, int], list[list[int]]]


def launch(script: Path, python: Path, cfg: dict[str, Any], env: dict[str, str], timeout: float) -> dict[str, Any]:
    """`python script CONFIG RESULT` in a fresh process given `cfg` (and "t0", now: cold start counts from here);
    {"status": "ok", "result": ...} or {"status": "failed", "error": ...}."""
    with tempfile.TemporaryDirectory(prefix="onnxmt-bench-") as tmp:
        cfg_path, result_path = Path(tmp) / "config.json", Path(tmp) / "result.json"
        cfg_path.write_text(json.dumps({**cfg, "t0": time.time()}), encoding="utf-8")
        command = [str(python), str(script), str(cfg_path), str(result_path)]
        try:
            proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"status": "failed", "error": f"timed out after {timeout:.0f} s"}
        if proc.returncode != 0 or not result_path.is_file():
            return {"status": "failed", "error": proc.stderr.strip()[-2000:]}
        return {"status": "ok", "result": json.loads(result_path.read_text(encoding="utf-8"))}


def run_from_argv(run: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """The child's side of `launch`: the config from argv[1] through `run` into the result file argv[2]."""
    config_path, result_path = sys.argv[1:3]
    cfg = json.loads(Path(config_path).read_text(encoding="utf-8"))
    result = run(cfg)
    Path(result_path).write_text(json.dumps(result, indent=1), encoding="utf-8")


def status_mb(key: str) -> float | None:
    """A figure of /proc/self/status in MB (VmHWM: the peak RSS; VmRSS: the RSS now); None where there is none."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return None


def peak_rss_mb() -> float:
    # VmHWM, not getrusage's ru_maxrss: Linux carries ru_maxrss over from the parent across fork + exec, so a
    # worker started by a parent that holds torch and a model would report the parent's peak.
    peak = status_mb("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB mostly


def _resident_by_mapping(top: int = 6) -> dict[str, float]:
    """The resident MB of the process's largest mappings (/proc/self/smaps): a file by its name (a model file's
    mapped pages), `[heap]` for malloc's main heap, `[anon]` for other anonymous memory (arenas, large arrays)."""
    sizes: dict[str, float] = {}
    name = "[anon]"
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                fields = line.split()
                if not fields[0].endswith(":"):
                    name = fields[5].rsplit("/", 1)[-1] if len(fields) > 5 else "[anon]"
                elif fields[0] == "Rss:":
                    sizes[name] = sizes.get(name, 0.0) + int(fields[1]) / 1024
    except OSError:  # not Linux
        return {}
    return {k: round(v, 1) for k, v in sorted(sizes.items(), key=lambda kv: -kv[1])[:top]}


def versions(*names: str) -> dict[str, str]:
    found = {}
    for name in names:
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    return found


def load_onnxmt(cfg: dict[str, Any]) -> TranslateFn:
    from onnxmt.runtime.options import DecodeOptions, RuntimeOptions
    from onnxmt.runtime.translator import Translator

    translator = Translator(
        cfg["model_dir"], RuntimeOptions(threads=cfg["threads"], spinning=bool(cfg.get("spinning"))), DecodeOptions()
    )
    languages = {"source_lang": cfg.get("source_lang"), "target_lang": cfg["target_lang"]}

    def translate(texts: Sequence[str], beams: int, n: int) -> list[list[int]]:
        forced = {"max_new_tokens": n, "min_new_tokens": n}
        out = translator.translate(list(texts), beams=beams, batch_size=len(texts), **languages, **forced)
        return [t.token_ids for t in out]

    return translate


def _hf_generate(model: Any, cfg: dict[str, Any]) -> TranslateFn:
    """`generate()` of a transformers or Optimum model, with its own tokenizer: Marian's `>>xx<<` prefix, or NLLB's
    source language (the tokenizer's `src_lang`) and target language (`forced_bos_token_id`)."""
    from transformers import AutoTokenizer

    source = cfg.get("source_lang")
    tokenizer = AutoTokenizer.from_pretrained(cfg["model_dir"], **({"src_lang": source} if source else {}))
    prefix = _task_prefix(Path(cfg["model_dir"]), cfg["target_lang"])
    if prefix is None:
        prefix = f">>{cfg['target_lang']}<< " if cfg["target_lang"] and not source else ""
    forced = {"forced_bos_token_id": tokenizer.convert_tokens_to_ids(cfg["target_lang"])} if source else {}
    eos = model.generation_config.eos_token_id

    def translate(texts: Sequence[str], beams: int, n: int) -> list[list[int]]:
        batch = tokenizer([prefix + t for t in texts], return_tensors="pt", padding=True)
        out = model.generate(**batch, num_beams=beams, max_new_tokens=n, min_new_tokens=n, **forced)
        tokenizer.batch_decode(out, skip_special_tokens=True)
        rows = [row[1:] for row in out.tolist()]  # (batch, 1 + new tokens): drop the decoder start token
        return [row[: row.index(eos) + 1] if eos in row else row for row in rows]

    return translate


def _task_prefix(model_dir: Path, target: str | None) -> str | None:
    """T5's text prefix into `target` (its config's `task_specific_params`, `translate English to German: `)."""
    config_file = model_dir / "config.json"
    config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
    for key, task in (config.get("task_specific_params") or {}).items():
        if target and key.endswith(f"_to_{target}") and isinstance(task, dict) and "prefix" in task:
            return str(task["prefix"])
    return None


def pytorch(threads: int) -> Any:
    """torch on `threads` intra-op threads and one inter-op thread, without gradients: every transformers row's."""
    import torch

    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)
    torch.set_grad_enabled(False)
    return torch


def load_transformers(cfg: dict[str, Any]) -> TranslateFn:
    from transformers import AutoModelForSeq2SeqLM

    torch = pytorch(cfg["threads"])
    # float32 whatever the checkpoint's dtype (opus-mt-tc-big ships float16; transformers 5 would load it so).
    model = AutoModelForSeq2SeqLM.from_pretrained(cfg["model_dir"], dtype=torch.float32).eval()
    return _hf_generate(model, cfg)


def load_optimum(cfg: dict[str, Any]) -> TranslateFn:
    import onnxruntime as ort
    import torch
    from optimum.onnxruntime import ORTModelForSeq2SeqLM

    torch.set_num_threads(cfg["threads"])  # Optimum's loop around ORT runs on torch tensors
    torch.set_grad_enabled(False)
    so = ort.SessionOptions()
    so.intra_op_num_threads = cfg["threads"]
    so.inter_op_num_threads = 1
    if cfg.get("spinning") is False:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    model = ORTModelForSeq2SeqLM.from_pretrained(cfg["model_dir"], session_options=so, provider="CPUExecutionProvider")
    return _hf_generate(model, cfg)


def load_ctranslate2(cfg: dict[str, Any]) -> TranslateFn:
    import ctranslate2
    import sentencepiece as spm

    translator = ctranslate2.Translator(
        cfg["model_dir"],
        device="cpu",
        compute_type=cfg.get("compute_type") or "default",
        intra_threads=cfg["threads"],
        inter_threads=1,
    )
    directory = Path(cfg["model_dir"])
    vocab_file = directory / "shared_vocabulary.json"
    ids = {token: i for i, token in enumerate(json.loads(vocab_file.read_text(encoding="utf-8")))}
    if (directory / "tokenizer.json").is_file():  # T5: its tokenizer.json and its config's task prefix
        return _ctranslate2_tokenizer_json(translator, directory, cfg, ids)
    # NLLB and mBART-50: one sentencepiece model, `[src_lang] X </s>`, the target language as the target prefix
    # (CTranslate2's documented usage of both); Marian: `>>xx<< X </s>` with its source and target models.
    nllb = (directory / "sentencepiece.bpe.model").is_file()
    source_file, target_file = ("sentencepiece.bpe.model",) * 2 if nllb else ("source.spm", "target.spm")
    source = spm.SentencePieceProcessor(model_file=str(directory / source_file))
    target = spm.SentencePieceProcessor(model_file=str(directory / target_file))
    if nllb:
        prefix, target_prefix = [cfg["source_lang"]], [cfg["target_lang"]]
    else:
        prefix, target_prefix = ([f">>{cfg['target_lang']}<<"] if cfg["target_lang"] else []), []

    def translate(texts: Sequence[str], beams: int, n: int) -> list[list[int]]:
        tokens = [[*prefix, *source.encode(t, out_type=str), "</s>"] for t in texts]
        # CTranslate2 sorts and splits by itself with max_batch_size; 0 keeps the harness's batches as given.
        results = translator.translate_batch(
            tokens,
            target_prefix=[target_prefix] * len(tokens) if target_prefix else None,
            beam_size=beams,
            max_decoding_length=n,
            min_decoding_length=n,
            max_batch_size=0,
        )
        hyps = [r.hypotheses[0] for r in results]
        target.decode_pieces(hyps)
        return [[ids[t] for t in h] for h in hyps]

    return translate


def _ctranslate2_tokenizer_json(translator: Any, directory: Path, cfg: dict[str, Any], ids: dict[str, int]):
    """CTranslate2 on a model tokenized by its tokenizer.json (T5's task prefix or MADLAD's `<2xx>` token written
    before the text)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    prefix = _task_prefix(directory, cfg["target_lang"]) or ""
    if cfg["target_lang"] and f"<2{cfg['target_lang']}>" in ids:  # MADLAD-400: `<2zh> X`, as onnxmt writes it
        prefix = f"<2{cfg['target_lang']}> "

    def translate(texts: Sequence[str], beams: int, n: int) -> list[list[int]]:
        tokens = [tokenizer.encode(prefix + t).tokens for t in texts]  # `</s>` appended by its post-processor
        results = translator.translate_batch(
            tokens, beam_size=beams, max_decoding_length=n, min_decoding_length=n, max_batch_size=0
        )
        hyps = [r.hypotheses[0] for r in results]
        return [[ids[t] for t in h] for h in hyps]

    return translate


ENGINES: dict[str, tuple[Callable[[dict[str, Any]], TranslateFn], tuple[str, ...]]] = {
    "onnxmt": (load_onnxmt, ("onnxmt", "onnxruntime", "numpy", "sentencepiece")),
    "transformers": (load_transformers, ("torch", "transformers", "sentencepiece")),
    "optimum": (load_optimum, ("optimum", "optimum-onnx", "onnxruntime", "torch", "transformers")),
    "ctranslate2": (load_ctranslate2, ("ctranslate2", "sentencepiece")),
}


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default), without numpy."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def _count(outputs: list[list[int]], expected: int, where: str) -> int:
    """Tokens generated; a run that stopped early would do less work than the others and look faster: refuse it."""
    lengths = {len(ids) for ids in outputs}
    if lengths != {expected}:
        raise RuntimeError(f"{where}: generated {sorted(lengths)} tokens per text, expected exactly {expected}")
    return expected * len(outputs)


def measure_latency(translate: TranslateFn, texts: list[str], beams: int, repeats: int, n: int) -> dict[str, Any]:
    """Batch-1 latency per sentence. Greedy also times each sentence with one new token, right after its n: a
    decoder step is (time of n − time of 1) / (n − 1) (the encoder, the first step and the tokenizer cancel out),
    the figure the bandwidth floor is compared with (floor.py)."""
    translate(texts[:1], beams, n)  # warm-up
    times, steps = [], []
    for _ in range(repeats):
        for text in texts:
            start = time.perf_counter()
            outputs = translate([text], beams, n)
            times.append(time.perf_counter() - start)
            _count(outputs, n, f"batch 1, beams {beams}")
            if beams == 1 and n > 1:
                start = time.perf_counter()
                _count(translate([text], beams, 1), 1, "batch 1, one token")
                steps.append((times[-1] - (time.perf_counter() - start)) / (n - 1))
    figures = {
        "median_ms": statistics.median(times) * 1000,
        "p90_ms": percentile(times, 90) * 1000,
        "samples": len(times),
    }
    if steps:
        figures["step_ms"] = statistics.median(steps) * 1000
    return figures


def measure_throughput(
    translate: TranslateFn, texts: list[str], beams: int, batch_size: int, repeats: int, n: int
) -> dict[str, Any]:
    batches = [texts[i : i + batch_size] for i in range(0, len(texts), batch_size)]
    translate(batches[0], beams, n)  # warm-up: first use of this batch shape
    rates = []
    for _ in range(repeats):
        tokens = 0
        start = time.perf_counter()
        for batch in batches:
            tokens += _count(translate(batch, beams, n), n, f"batch {batch_size}, beams {beams}")
        rates.append(tokens / (time.perf_counter() - start))
    return {"tokens_per_s": statistics.median(rates), "runs": [round(r, 2) for r in rates], "texts": len(texts)}


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    """Everything one engine is measured on; `cfg["t0"]` is the wall-clock time the parent started this process."""
    load, packages = ENGINES[cfg["engine"]]
    texts: list[str] = cfg["texts"]  # the first N input lines, in file order
    by_length = [texts[i] for i in cfg["order"]]  # sorted by source length, so batches hold similar lengths
    n = cfg["max_new_tokens"]
    start = time.perf_counter()
    translate = load(cfg)
    loaded = time.perf_counter()
    first = translate(texts[: cfg["cold_batch"]], 1, n)
    _count(first, n, "cold batch")
    cold = {
        "cold_start_s": time.time() - cfg["t0"],
        "load_s": loaded - start,
        "first_batch_s": time.perf_counter() - loaded,
        "peak_rss_mb": peak_rss_mb(),
    }
    # The peak after each column: which one sets the whole run's.
    peaks = {"cold batch": cold["peak_rss_mb"]}
    latency = {}
    for beams in cfg["beams"]:
        latency[str(beams)] = measure_latency(translate, texts[: cfg["latency_texts"]], beams, cfg["repeats"], n)
        peaks[f"beam {beams} latency"] = peak_rss_mb()
    throughput = {}
    for beams in cfg["beams"]:
        for bs in cfg["batch_sizes"]:
            throughput[f"{beams}x{bs}"] = measure_throughput(translate, by_length, beams, bs, cfg["repeats"], n)
            peaks[f"beam {beams} bs{bs}"] = peak_rss_mb()
    return {
        **cold,
        "latency": latency,
        "throughput": throughput,
        "peak_rss_end_mb": peak_rss_mb(),
        "peak_rss_after_column_mb": peaks,
        "resident_end_mb": _resident_by_mapping(),
        "cold_batch_tokens": first,  # greedy output of the first texts, to check that engines agree
        "versions": {"python": platform.python_version(), **versions(*packages)},
        "executable": sys.executable,
        "pid": os.getpid(),
    }


if __name__ == "__main__":
    run_from_argv(run)
