"""`onnxmt eval`: quality, size, latency and memory of model directories, side by side.

Each model runs in a fresh Python process (this module run as `python -m onnxmt.eval`), so its peak RSS is its own
and one model's allocations or thread pools do not slow the next. The worker streams JSON lines to the parent:
`{"progress": n}` while it works, then `{"result": {...}}`. The parent scores the translations with sacrebleu.

ONNX rows need the run side only (and sacrebleu); a PyTorch reference row (`--reference`) needs the export extra.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .options import check, option, restore
from .runtime.invariance import InvarianceOptions
from .runtime.options import BatchLimits, DecodeOptions, RuntimeOptions

# The languages sacrebleu must segment into characters ("zh" tokenisation) before counting n-grams.
CHINESE = {"zh", "zho", "cmn", "yue", "wuu", "lzh", "chinese"}

COLUMNS = (
    "model",
    "quantization",
    "size MB",
    "BLEU",
    "chrF",
    "latency ms (batch 1, median)",
    "sentences/s (batch N)",
    "peak RSS MB",
    "load s",
    "same tokens batched",
)
# What the last column means, under the table (a "0/2" there alarms without it).
BATCHED_NOTE = (
    "same tokens batched: of the first {sample} sentences, how many translate to the same tokens alone and in "
    "shuffled batches of 8. Dynamic int8 computes its activation scales over the whole batch, so a sentence's "
    "neighbours can change its tokens; `onnxmt quantize --per-row-scales` makes int8 where they cannot (fp32 is "
    "checked only with --batch-check)."
)


@dataclass(frozen=True)
class EvalOptions:
    """decoding: None takes each model's defaults; batching: batch_size is the batch of the throughput (and
    quality) pass.
    runtime: threads is torch's too, for a PyTorch reference. invariance: the batch check (runtime/invariance.py).
    source_lang, target_lang: the language pair, as `Translator.translate` takes it."""

    limit: int | None = option(None, help="Use the first N sentence pairs.")
    decoding: DecodeOptions = DecodeOptions()
    batching: BatchLimits = BatchLimits()
    latency_sentences: int = option(20, help="Sentences timed one at a time (batch 1).", min=0)
    runtime: RuntimeOptions = RuntimeOptions()
    tokenize: str | None = option(None, help="sacrebleu tokenizer (default: zh for Chinese targets, else 13a).")
    invariance: InvarianceOptions = InvarianceOptions()
    source_lang: str | None = None
    target_lang: str | None = None

    def __post_init__(self) -> None:
        check(self)


@dataclass(frozen=True)
class EvalRow:
    model: str
    kind: str  # "onnx" or "pytorch"
    quantization: str
    size_bytes: int
    bleu: float
    chrf: float
    latency_ms: float  # median per sentence at batch 1
    sentences_per_second: float  # at EvalOptions.batch_size, over the whole corpus
    peak_rss_bytes: int
    load_seconds: float
    hypotheses: list[str] = field(repr=False, default_factory=list)
    batch_invariance: dict[str, Any] | None = None  # BatchInvariance.to_dict(); None: not checked

    def cells(self) -> list[str]:
        return [
            self.model,
            self.quantization,
            f"{self.size_bytes / 1e6:.1f}",
            f"{self.bleu:.2f}",
            f"{self.chrf:.2f}",
            f"{self.latency_ms:.1f}",
            f"{self.sentences_per_second:.2f}",
            f"{self.peak_rss_bytes / 1e6:.0f}",
            f"{self.load_seconds:.2f}",
            _invariance_cell(self.batch_invariance),
        ]


def _invariance_cell(check: dict[str, Any] | None) -> str:
    if check is None:
        return ""
    return f"{check['identical']}/{check['sentences']}"


@dataclass
class EvalReport:
    rows: list[EvalRow]
    sentences: int
    tokenize: str
    options: EvalOptions
    machine: dict[str, Any]

    def to_markdown(self) -> str:
        header = [c.replace("batch N", f"batch {self.options.batching.batch_size}") for c in COLUMNS]
        lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
        lines += ["| " + " | ".join(row.cells()) + " |" for row in self.rows]
        notes = (
            f"{self.sentences} sentences; sacrebleu tokenize={self.tokenize!r}; latency over the first "
            f"{min(self.options.latency_sentences, self.sentences)} sentences one at a time; each model in a fresh "
            f"process; {self.machine.get('cpu', '?')} ({self.machine.get('cores')} cores; "
            f"{' '.join(self.machine.get('cpu_flags', [])) or 'no AVX2'})."
        )
        if any(row.batch_invariance for row in self.rows):
            notes += " " + BATCHED_NOTE.format(sample=min(self.options.invariance.batch_sample, self.sentences))
        return "\n".join(lines) + "\n\n" + notes + "\n"

    def to_json(self) -> str:
        data = {
            "sentences": self.sentences,
            "tokenize": self.tokenize,
            "options": asdict(self.options),
            "machine": self.machine,
            "columns": list(COLUMNS),
            "rows": [{k: v for k, v in asdict(row).items() if k != "hypotheses"} for row in self.rows],
        }
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def score(hypotheses: Sequence[str], references: Sequence[str], tokenize: str) -> tuple[float, float]:
    """Corpus BLEU (with `tokenize`) and chrF, as sacrebleu computes them."""
    import sacrebleu

    bleu = sacrebleu.corpus_bleu(list(hypotheses), [list(references)], tokenize=tokenize)
    chrf = sacrebleu.corpus_chrf(list(hypotheses), [list(references)])
    return float(bleu.score), float(chrf.score)


def bleu_tokenizer(*languages: str | None) -> str:
    """sacrebleu's tokenizer for the first known language among `languages` ("cmn_Hans", "zh", "zho_Hans", ...)."""
    for lang in languages:
        if lang:
            code = lang.strip(">< ").replace("-", "_").split("_")[0].lower()
            return "zh" if code in CHINESE else "13a"
    return "13a"


def read_pairs(src: Path, ref: Path, limit: int | None) -> tuple[list[str], list[str]]:
    sources = src.read_text(encoding="utf-8").splitlines()
    references = ref.read_text(encoding="utf-8").splitlines()
    if len(sources) != len(references):
        raise ValueError(f"{src} has {len(sources)} lines but {ref} has {len(references)}; they must pair line by line")
    if limit is not None:
        if limit < 1:
            raise ValueError(f"--limit must be at least 1, got {limit}")
        sources, references = sources[:limit], references[:limit]
    if not sources:
        raise ValueError(f"{src}: no sentences")
    return sources, references


def evaluate(
    model_dirs: Sequence[str | Path],
    src: Path,
    ref: Path,
    options: EvalOptions = EvalOptions(),
    reference: str | None = None,
    progress: Callable[[str, int, int], None] = lambda name, done, total: None,
) -> EvalReport:
    """Run every model directory (and the PyTorch `reference`, if given) in its own process and score it."""
    from .runtime.modeldir import load_manifest

    sources, references = read_pairs(src, ref, options.limit)
    manifests = [load_manifest(d) for d in model_dirs]
    target = options.target_lang or (manifests[0].languages.get("default_target") if manifests else None)
    tokenize = options.tokenize or bleu_tokenizer(
        target, ref.suffix.lstrip("."), manifests[0].languages.get("target") if manifests else None
    )
    jobs: list[dict[str, Any]] = [{"kind": "onnx", "model": str(d)} for d in model_dirs]
    if reference is not None:
        prompt = _reference_prompt(Path(model_dirs[0]), manifests[0], options.source_lang, target) if manifests else {}
        jobs.append({"kind": "pytorch", "model": reference, "prompt": prompt})
    rows = []
    with tempfile.TemporaryDirectory(prefix="onnxmt-eval-") as tmp:
        src_file = Path(tmp) / "src.txt"
        src_file.write_text("\n".join(sources) + "\n", encoding="utf-8")
        for job in jobs:
            job.update(src_file=str(src_file), options=asdict(options))
            result = _run_worker(job, Path(tmp), progress)
            bleu, chrf = score(result["hypotheses"], references, tokenize)
            rows.append(
                EvalRow(
                    bleu=bleu,
                    chrf=chrf,
                    **{k: v for k, v in result.items() if k != "hypotheses"},
                    hypotheses=result["hypotheses"],
                )
            )
    return EvalReport(rows=rows, sentences=len(sources), tokenize=tokenize, options=options, machine=_machine())


def _reference_prompt(model_dir: Path, manifest: Any, source: str | None, target: str | None) -> dict[str, Any]:
    """What the PyTorch reference needs of the model's language scheme (architectures/schemes.py): the text
    prefix, the source language to set on its tokenizer, the forced first token."""
    from .architectures import scheme_for
    from .runtime.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(model_dir, manifest.tokenizer.get("kind"))
    scheme = scheme_for(manifest.languages, tokenizer.token_id)
    prompt = scheme.prompt(source, target)
    found: dict[str, Any] = {"text": prompt.text, "source": scheme.languages.resolve_source(source)}
    found["forced_bos"] = prompt.forced_bos
    if prompt.chat is not None:  # a decoder-only model: its chat template around the family's request
        found.update(pair=list(prompt.chat), languages=manifest.languages, eos_ids=manifest.tokens["eos_ids"])
    return found


def _run_worker(job: dict[str, Any], tmp: Path, progress: Callable[[str, int, int], None]) -> dict[str, Any]:
    """Run one job in a fresh interpreter; relay its progress; return its result or raise with its stderr."""
    name = job["model"]
    stderr_path = tmp / "stderr.txt"
    with open(stderr_path, "w+", encoding="utf-8") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "onnxmt.eval", json.dumps(job)],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
        assert proc.stdout is not None
        result = None
        for line in proc.stdout:
            message = json.loads(line)
            if "progress" in message:
                progress(name, *message["progress"])
            elif "result" in message:
                result = message["result"]
        proc.wait()
        if proc.returncode != 0 or result is None:
            stderr.seek(0)
            tail = stderr.read()[-2000:]
            raise RuntimeError(f"evaluating {name} failed (exit code {proc.returncode}):\n{tail}")
    return result


def _machine() -> dict[str, Any]:
    import platform

    cpu, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                cpu = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    except OSError:
        pass
    # The int8 kernels' speed depends on these (AVX2 only: no int8 dot-product instructions).
    relevant = sorted(flags & {"avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8", "fma"})
    return {"cpu": cpu, "cores": os.cpu_count(), "cpu_flags": relevant, "python": platform.python_version()}


# ---------------------------------------------------------------------------------------------------------------
# The worker: one model, in this process.


def _peak_rss_bytes() -> int:
    try:
        import resource
    except ImportError:  # Windows
        import psutil

        return int(psutil.Process().memory_info().peak_wset)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # bytes on macOS, KiB on Linux


def _size_on_disk(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


class _OnnxModel:
    def __init__(self, model: str, options: EvalOptions) -> None:
        from .runtime.translator import Translator

        decoding = options.decoding
        self.translator = Translator(
            model, options.runtime, DecodeOptions(beams=decoding.beams, max_new_tokens=decoding.max_new_tokens)
        )
        self.source_lang, self.target_lang = options.source_lang, options.target_lang
        self.size = _size_on_disk(Path(model))
        quantization = self.translator.manifest.quantization
        self.quantization = quantization.get("method", "?") if quantization else "fp32"

    def translate(self, texts: list[str], batch_size: int) -> list[str]:
        translations = self.translator.translate(
            texts, source_lang=self.source_lang, target_lang=self.target_lang, batching=BatchLimits(batch_size)
        )
        return [t.text for t in translations]

    def batch_invariance(self, texts: list[str], options: EvalOptions) -> dict[str, Any] | None:
        from .runtime.invariance import batch_invariance

        if not options.invariance.wanted(self.translator.manifest):
            return None
        sample = options.invariance.batch_sample
        check = batch_invariance(
            self.translator, texts, sample=sample, source_lang=self.source_lang, target_lang=self.target_lang
        )
        return check.to_dict()


class _PytorchModel:
    def __init__(self, model: str, options: EvalOptions, prompt: dict[str, Any]) -> None:
        import torch
        from transformers import AutoTokenizer
        from transformers.utils import logging

        logging.set_verbosity_error()  # this process is ours: no notices about max_length vs max_new_tokens
        logging.disable_progress_bar()

        from .architectures import get_architecture
        from .export.hub import resolve_model

        if options.runtime.threads:
            torch.set_num_threads(options.runtime.threads)
        source, _ = resolve_model(model)
        config = json.loads((source / "config.json").read_text(encoding="utf-8"))
        self.torch = torch
        self.model = get_architecture(config.get("model_type")).load(str(source))
        self.tokenizer = AutoTokenizer.from_pretrained(str(source))
        settings = {"num_beams": options.decoding.beams, "max_new_tokens": options.decoding.max_new_tokens}
        self.generate_kwargs = {k: v for k, v in settings.items() if v is not None}  # None: the model's default
        self.prefix = prompt.get("text", "")
        if prompt.get("source") is not None and hasattr(self.tokenizer, "src_lang"):
            self.tokenizer.src_lang = prompt["source"]
        if prompt.get("forced_bos") is not None:
            self.generate_kwargs["forced_bos_token_id"] = prompt["forced_bos"]
        self.pair = prompt.get("pair")  # a decoder-only model's language pair, for its chat prompt
        self.prompt = prompt
        self.size = _size_on_disk(source)
        self.quantization = "fp32 (PyTorch)"

    def translate(self, texts: list[str], batch_size: int) -> list[str]:
        if self.pair is not None:
            return self._translate_chat(texts)
        # Sorted into batches of similar length, as the Translator does, so both pay for the same padding.
        order = sorted(range(len(texts)), key=lambda i: len(self.tokenizer(texts[i]).input_ids))
        out: list[str] = [""] * len(texts)
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            encoded = self.tokenizer(
                [self.prefix + texts[i] for i in batch],
                return_tensors="pt",
                padding=True,
                truncation=True,
                max_length=min(self.tokenizer.model_max_length, self.model.config.max_position_embeddings),
            )
            with self.torch.no_grad():
                generated = self.model.generate(**encoded, **self.generate_kwargs)
            for i, text in zip(batch, self.tokenizer.batch_decode(generated, skip_special_tokens=True), strict=True):
                out[i] = text
        return out

    def _translate_chat(self, texts: list[str]) -> list[str]:
        """A decoder-only model's translations: each text's prompt through transformers' chat template, generated
        alone, deterministic as onnxmt decodes (export/reference.py)."""
        from .architectures import Prompt
        from .export import reference

        assert self.pair is not None
        prompt = Prompt(chat=(self.pair[0], self.pair[1]))
        out: list[str] = []
        for text in texts:
            ids = reference.chat_ids(self.tokenizer, self.prompt["languages"], text, prompt)
            new = reference.generate(self.torch, self.model, ids, self.prompt["eos_ids"], **self.generate_kwargs)
            out.append(str(self.tokenizer.decode(new, skip_special_tokens=True)))
        return out


def _emit(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def run_worker(job: dict[str, Any]) -> dict[str, Any]:
    options = restore(EvalOptions, job["options"])
    texts = Path(job["src_file"]).read_text(encoding="utf-8").splitlines()
    timed = texts[: options.latency_sentences]
    total = len(timed) + len(texts)
    start = time.perf_counter()
    model: _OnnxModel | _PytorchModel
    if job["kind"] == "onnx":
        model = _OnnxModel(job["model"], options)
    else:
        model = _PytorchModel(job["model"], options, job.get("prompt") or {})
    load_seconds = time.perf_counter() - start
    model.translate(texts[:1], 1)  # warm-up: first-run allocations and lazy initialisation
    latencies = []
    for i, text in enumerate(timed):
        t0 = time.perf_counter()
        model.translate([text], 1)
        latencies.append(time.perf_counter() - t0)
        _emit({"progress": [i + 1, total]})
    hypotheses: list[str] = []
    t0 = time.perf_counter()
    batch_size = options.batching.batch_size
    chunk = batch_size * 4  # long enough to sort into full batches, short enough to report progress
    for begin in range(0, len(texts), chunk):
        hypotheses += model.translate(texts[begin : begin + chunk], batch_size)
        _emit({"progress": [len(timed) + len(hypotheses), total]})
    elapsed = time.perf_counter() - t0
    check = model.batch_invariance(texts, options) if isinstance(model, _OnnxModel) else None
    return {
        "model": job["model"],
        "kind": job["kind"],
        "quantization": model.quantization,
        "size_bytes": model.size,
        "latency_ms": 1000 * statistics.median(latencies) if latencies else float("nan"),
        "sentences_per_second": len(texts) / elapsed if elapsed > 0 else float("nan"),
        "peak_rss_bytes": _peak_rss_bytes(),
        "load_seconds": load_seconds,
        "hypotheses": hypotheses,
        "batch_invariance": check,
    }


if __name__ == "__main__":
    _emit({"result": run_worker(json.loads(sys.argv[1]))})
