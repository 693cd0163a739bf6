"""One decoder-only engine, measured in a fresh process: `python decoder_worker.py CONFIG.json RESULT.json`.

`bench.py decoder` starts it (worker.launch) once per row and round, with the interpreter of the environment the
engine lives in (onnxmt in the project's, llama-cpp-python, onnxruntime-genai, CTranslate2 and transformers in the
bench venv), so it imports nothing but the standard library and worker.py (which imports nothing else) at the top.
Every engine is given the same prompt ids (no tokenizer is timed: the prompts are the model's chat template around
a text, tokenized once by the parent), decodes greedily, with every eos id suppressed, exactly `n` new tokens per
prompt, on `threads` threads.

Order of work: import + load + the 100-token prompt with n new tokens -> cold start and peak RSS; then, after a
warm-up, per figure the median of `repeats` runs:
- prefill tokens/s of a prompt of L tokens: L / (time to the first new token), L = 100 and 500;
- decode ms/token at batch 1: (time of n new tokens - time of 1) / (n - 1), the 100-token prompt;
- tokens/s at batch 8: 8 prompts of 100 tokens, n new tokens each, generated tokens / time.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from worker import peak_rss_mb, pytorch, run_from_argv, status_mb, versions

# Greedy tokens for a batch of prompts (equal lengths in every call the worker makes): exactly n per prompt.
Generate = Callable[[Sequence[Sequence[int]], int], list[list[int]]]


def load_onnxmt(cfg: dict[str, Any]) -> Generate:
    from onnxmt.runtime.options import BatchLimits, DecodeOptions, RuntimeOptions
    from onnxmt.runtime.translator import Translator

    translator = Translator(
        cfg["path"],
        RuntimeOptions(threads=cfg["threads"]),
        DecodeOptions(beams=1, repetition_penalty=1.0),
        BatchLimits(batch_size=8),
    )
    languages = {"source_lang": cfg["source_lang"], "target_lang": cfg["target_lang"]}

    def generate(prompts: Sequence[Sequence[int]], n: int) -> list[list[int]]:
        # The prompts' ids as given; the text is only a placeholder (prepare skips tokenizing when ids are given).
        prepared = translator.prepare(
            ["-"] * len(prompts), ids=prompts, max_new_tokens=n, min_new_tokens=n, **languages
        )
        return [t.token_ids for t in translator.translate_prepared(prepared, batching=BatchLimits(len(prompts)))]

    return generate


def load_llama(cfg: dict[str, Any]) -> Generate:
    """llama.cpp through llama-cpp-python's bindings of its C API: one llama_decode per prompt chunk and per step,
    every sequence of a batch in the same call (as llama-server and llama-batched-bench run them), greedy on the
    logits of each sequence's last position. A context sized for one sequence first (its cold start and RSS);
    the batch column opens one for 8."""
    import ctypes

    import llama_cpp as lc
    import numpy as np

    lc.llama_backend_init()
    params = lc.llama_model_default_params()
    model = lc.llama_model_load_from_file(cfg["path"].encode(), params)
    if not model:
        raise RuntimeError(f"llama.cpp cannot load {cfg['path']}")
    vocab = lc.llama_model_get_vocab(model)
    n_vocab = lc.llama_vocab_n_tokens(vocab)
    eos = np.array(cfg["eos_ids"], dtype=np.int64)
    state: dict[str, Any] = {"ctx": None, "seqs": 0}

    def context(seqs: int, per_seq: int) -> Any:
        if state["seqs"] == seqs:
            return state["ctx"]
        if state["ctx"] is not None:
            lc.llama_free(state["ctx"])
        cp = lc.llama_context_default_params()
        cp.n_ctx = seqs * per_seq
        cp.n_batch = cp.n_ubatch = 512
        cp.n_seq_max = seqs
        cp.n_threads = cp.n_threads_batch = cfg["threads"]
        state["ctx"], state["seqs"] = lc.llama_init_from_model(model, cp), seqs
        return state["ctx"]

    batch = lc.llama_batch_init(512, 0, 8)

    def decode(ctx: Any, rows: list[tuple[int, list[int], int]]) -> np.ndarray:
        """rows: (sequence, tokens, first position); the logits (rows, vocab) at each row's last token."""
        batch.n_tokens = 0
        last = []
        for seq, tokens, start in rows:
            for j, token in enumerate(tokens):
                i = batch.n_tokens
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, start + j, 1
                batch.seq_id[i][0] = seq
                batch.logits[i] = j == len(tokens) - 1
                batch.n_tokens += 1
            last.append(batch.n_tokens - 1)
        if lc.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        out = np.empty((len(rows), n_vocab), dtype=np.float32)
        for r, i in enumerate(last):
            pointer = lc.llama_get_logits_ith(ctx, i)
            out[r] = np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), shape=(n_vocab,))
        return out

    def greedy(logits: np.ndarray) -> list[int]:
        logits[:, eos] = -np.inf
        return logits.argmax(axis=1).tolist()

    def generate(prompts: Sequence[Sequence[int]], n: int) -> list[list[int]]:
        ctx = context(1 if len(prompts) == 1 else 8, 1024 if len(prompts) == 1 else 256)
        lc.llama_memory_clear(lc.llama_get_memory(ctx), True)
        length = len(prompts[0])
        logits = None
        for start in range(0, length, 512 // len(prompts)):
            chunk = [(s, list(p[start : start + 512 // len(prompts)]), start) for s, p in enumerate(prompts)]
            logits = decode(ctx, chunk)
        assert logits is not None
        out = [[t] for t in greedy(logits)]
        for step in range(1, n):
            logits = decode(ctx, [(s, [row[-1]], length + step - 1) for s, row in enumerate(out)])
            for row, token in zip(out, greedy(logits), strict=True):
                row.append(token)
        return out

    return generate


def load_ortgenai(cfg: dict[str, Any]) -> Generate:
    import numpy as np
    import onnxruntime_genai as og

    config = og.Config(cfg["path"])
    threads = cfg["threads"]
    config.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": threads}}}}))
    model = og.Model(config)

    def generate(prompts: Sequence[Sequence[int]], n: int) -> list[list[int]]:
        length = len(prompts[0])
        params = og.GeneratorParams(model)
        params.set_search_options(
            max_length=length + n, min_length=length + n, do_sample=False, batch_size=len(prompts)
        )
        generator = og.Generator(model, params)
        generator.append_tokens(np.array(prompts, dtype=np.int32))
        while not generator.is_done():
            generator.generate_next_token()
        return [[int(t) for t in generator.get_sequence(i)[length:]] for i in range(len(prompts))]

    return generate


def load_ctranslate2(cfg: dict[str, Any]) -> Generate:
    import ctranslate2

    generator = ctranslate2.Generator(
        cfg["path"], device="cpu", compute_type="int8", intra_threads=cfg["threads"], inter_threads=1
    )
    directory = Path(cfg["path"])
    vocabulary = json.loads((directory / "vocabulary.json").read_text(encoding="utf-8"))

    def generate(prompts: Sequence[Sequence[int]], n: int) -> list[list[int]]:
        tokens = [[vocabulary[i] for i in p] for p in prompts]
        results = generator.generate_batch(
            tokens, max_length=n, min_length=n, sampling_topk=1, include_prompt_in_result=False, max_batch_size=0
        )
        return [list(r.sequences_ids[0]) for r in results]

    return generate


def load_transformers(cfg: dict[str, Any]) -> Generate:
    from transformers import AutoModelForCausalLM

    torch = pytorch(cfg["threads"])
    model = AutoModelForCausalLM.from_pretrained(cfg["path"], dtype=torch.float32).eval()

    def generate(prompts: Sequence[Sequence[int]], n: int) -> list[list[int]]:
        ids = torch.tensor([list(p) for p in prompts])
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            num_beams=1,
            pad_token_id=cfg["eos_ids"][0],
        )
        return out[:, ids.shape[1] :].tolist()

    return generate


ENGINES: dict[str, tuple[Callable[[dict[str, Any]], Generate], tuple[str, ...]]] = {
    "onnxmt": (load_onnxmt, ("onnxmt", "onnxruntime", "numpy")),
    "llama": (load_llama, ("llama_cpp_python", "numpy")),
    "ortgenai": (load_ortgenai, ("onnxruntime-genai", "numpy")),
    "ctranslate2": (load_ctranslate2, ("ctranslate2",)),
    "transformers": (load_transformers, ("torch", "transformers")),
}


def _exactly(outputs: list[list[int]], n: int, where: str) -> list[list[int]]:
    """A run that stopped early would do less work and look faster: refuse it."""
    lengths = sorted({len(row) for row in outputs})
    if lengths != [n]:
        raise RuntimeError(f"{where}: generated {lengths} tokens per prompt, expected exactly {n}")
    return outputs


def _timed(generate: Generate, prompts: list[list[int]], n: int, repeats: int, where: str) -> float:
    """Median seconds of `repeats` runs."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        _exactly(generate(prompts, n), n, where)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    """Every figure of one engine; `cfg["t0"]`: the parent's wall clock when it started this process."""
    load, packages = ENGINES[cfg["engine"]]
    prompts = cfg["prompts"]  # {"100": ids, "500": ids, "batch": [ids] * 8}
    n, repeats = cfg["max_new_tokens"], cfg["repeats"]
    start = time.perf_counter()
    generate = load(cfg)
    loaded = time.perf_counter()
    first = _exactly(generate([prompts["100"]], n), n, "cold")
    cold = {
        "cold_start_s": time.time() - cfg["t0"],
        "load_s": loaded - start,
        "peak_rss_mb": peak_rss_mb(),
        "rss_mb": status_mb("VmRSS") or 0.0,
    }
    prefill = {}
    for length in ("100", "500"):
        generate([prompts[length]], 1)  # warm-up: first use of this length
        prefill[length] = int(length) / _timed(generate, [prompts[length]], 1, repeats, f"prefill {length}")
    one = _timed(generate, [prompts["100"]], 1, repeats, "first token")
    many = _timed(generate, [prompts["100"]], n, repeats, "decode")
    batch = prompts["batch"]
    generate(batch, 2)  # warm-up: first use of a batch of 8
    batch_start = time.perf_counter()
    batch_tokens = _exactly(generate(batch, n), n, "batch 8")
    batch_s = time.perf_counter() - batch_start
    rates = [len(batch) * n / batch_s]
    for _ in range(repeats - 1):
        rates.append(len(batch) * n / _timed(generate, batch, n, 1, "batch 8"))
    return {
        **cold,
        "prefill_tokens_per_s": prefill,
        "first_token_ms": one * 1000,
        "decode_ms_per_token": (many - one) / (n - 1) * 1000,
        "batch8_tokens_per_s": statistics.median(rates),
        "peak_rss_end_mb": peak_rss_mb(),
        "tokens": {"100": first[0], "batch": batch_tokens},
        "versions": {"python": platform.python_version(), **versions(*packages)},
        "executable": sys.executable,
        "pid": os.getpid(),
    }


if __name__ == "__main__":
    run_from_argv(run)
