"""The `onnxmt` command line. Build-side commands import torch lazily; run-side commands never do."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .manifest import ModelDirError

app = typer.Typer(
    name="onnxmt",
    help="HuggingFace translation models on ONNX Runtime, without torch: export, prove, shrink, translate, serve.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err = Console(stderr=True)


def fail(message: str) -> NoReturn:
    """A user error: `Error: ...` on stderr and exit code 2, no traceback."""
    err.print(f"[red]Error:[/red] {escape(message)}", highlight=False)
    raise typer.Exit(code=2)


TARGET_LANG_HELP = (
    "Target language of a multi-target model, as clients write it: zh, zt, zh-TW, cmn_Hant, >>cmn_Hant<< "
    "(see /languages of onnxmt serve)."
)
VariantOption = Annotated[
    str | None,
    typer.Option(
        "--variant",
        envvar="ONNXMT_VARIANT",
        help="Graphs of an Optimum/Transformers.js directory to load: fp32, quantized (q8), int8, uint8, q4, bnb4, "
        "fp16, q4f16 (default: fp32 if present, else the first of those present).",
    ),
]
SOURCE_LANG_HELP = (
    "Source language of a model told it by a token, in the model's codes or as clients write them: eng_Latn, en "
    "(NLLB-200, M2M100; default: the model's, English). Other models check it against their one source."
)

ModelOption = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        envvar="ONNXMT_MODEL",
        help="Exported model directory, or a hub id exported on first use (default: Helsinki-NLP/opus-mt-en-zh).",
    ),
]


@app.command()
def export(
    model: Annotated[str, typer.Argument(help="Hub id (e.g. Helsinki-NLP/opus-mt-en-zh) or local model directory.")],
    output_dir: Annotated[Path, typer.Argument(help="Directory to write (must be new or empty unless --force).")],
    opset: Annotated[int, typer.Option(help="ONNX opset.")] = 17,
    revision: Annotated[str | None, typer.Option(help="Hub revision (branch, tag or commit).")] = None,
    default_target: Annotated[
        str | None, typer.Option(help="Default target language of a multi-target model, e.g. cmn_Hans.")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace a non-empty OUTPUT_DIR.")] = False,
    check: Annotated[bool, typer.Option(help="Compare the ONNX graphs with PyTorch after export.")] = True,
    cache_buffer: Annotated[
        bool,
        typer.Option(
            "--cache-buffer/--cache-concat",
            help="Decoder self-attention cache as a buffer the runtime writes in place (the default: the cache is "
            "held once), or taken and returned grown by a Concat in the graph, as directories exported before "
            "this default have it (docs/performance.md).",
        ),
    ] = True,
) -> None:
    """Export a MarianMT, M2M100 or NLLB-200 model to a self-contained onnxmt directory (needs onnxmt\\[export])."""
    try:
        from .export.exporter import ExportOptions
        from .export.exporter import export as run_export
    except ImportError as e:
        fail(f"export needs torch and transformers: pip install 'onnxmt[export]' ({e})")
    options = ExportOptions(
        opset=opset,
        revision=revision,
        force=force,
        default_target=default_target,
        check=check,
        buffered_cache=cache_buffer,
    )
    with err.status("exporting") as status:
        try:
            _, report = run_export(model, output_dir, options, progress=lambda msg: status.update(msg))
        except (ValueError, OSError) as e:
            fail(str(e))
    if report is not None:
        err.print(
            f"checked against PyTorch: encoder max |diff| {report.encoder_max_abs_diff:.2e}, "
            f"first-step logits {report.first_step_logits_max_abs_diff:.2e}, "
            f"cached step {report.cached_step_logits_max_abs_diff:.2e}"
        )
    err.print(f"[green]wrote {output_dir}[/green]")


@app.command()
def inspect(
    model_dir: Annotated[Path, typer.Argument(help="onnxmt, Optimum or Transformers.js model directory.")],
    variant: VariantOption = None,
) -> None:
    """Show a model directory: manifest summary, each graph's quantization (read from the graph) and its inputs and
    outputs."""
    from .runtime.graphinfo import read_graph
    from .runtime.modeldir import load_manifest
    from .runtime.options import RuntimeOptions

    try:
        manifest = load_manifest(model_dir, verify=True, options=RuntimeOptions(threads=1, variant=variant))
        found = {part: read_graph(model_dir / graph.file) for part, graph in manifest.graphs.items()}
    except (ModelDirError, ValueError, OSError) as e:
        fail(str(e))
    out = Console()
    summary = Table(title=f"{model_dir}", show_header=False)
    langs = manifest.languages
    rows = {
        "architecture": manifest.architecture,
        "layout": manifest.layout,
        "source model": manifest.provenance.get("source_model", "?"),
        "model": ", ".join(f"{k}={v}" for k, v in manifest.model.items()),
        "special tokens": ", ".join(f"{k}={v}" for k, v in manifest.tokens.items()),
        "generation": ", ".join(f"{k}={v}" for k, v in manifest.generation.items()) or "(transformers defaults)",
        "languages": f"{langs.get('source')} -> {langs.get('target')}",
        "language scheme": str(langs.get("scheme", "target_token_prefix")),
        "source tokens": f"{len(langs['source_tokens'])} (default {langs.get('default_source')})"
        if langs.get("source_tokens")
        else "(none)",
        "target tokens": ", ".join(sorted(langs.get("target_tokens", {}))) or "(single target)",
        "default target": str(langs.get("default_target")),
        "variant": _variants(manifest),
        "quantization (manifest)": str(manifest.quantization.get("method")) if manifest.quantization else "none",
        **{f"{part} graph": contents.quantization() for part, contents in found.items()},
        "files": ", ".join(f"{n} ({_size(i.get('bytes'))})" for n, i in manifest.files.items()),
    }
    for key, value in rows.items():
        summary.add_row(key, value)
    out.print(summary)
    for part, graph in manifest.graphs.items():
        table = Table(title=f"{part}: {graph.file}")
        for column in ("", "name", "role", "dtype", "shape"):
            table.add_column(column)
        for kind, specs in (("in", graph.inputs), ("out", graph.outputs)):
            for spec in specs:
                table.add_row(kind, spec.name, spec.role, spec.dtype, "(" + ", ".join(map(str, spec.shape)) + ")")
        out.print(table)


def _variants(manifest: Any) -> str:
    """`quantized (also present: fp32, q4)` for Optimum/Transformers.js directories; the onnxmt directory's one."""
    from .layout import onnxmt_variant

    chosen = manifest.provenance.get("variant") or onnxmt_variant(manifest.quantization)
    others = [v for v in manifest.provenance.get("variants", []) if v != chosen]
    return chosen + (f" (also present: {', '.join(others)}; choose with --variant)" if others else "")


def _report_variant(manifest: Any) -> None:
    """On stderr, which variant of an Optimum/Transformers.js directory runs, when it holds more than one."""
    if len(manifest.provenance.get("variants", [])) > 1:
        err.print(f"variant: {escape(_variants(manifest))}", highlight=False)


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def _read_lines(texts: list[str], input_file: Path | None) -> tuple[list[str] | Iterator[str], int | None]:
    if texts and input_file is not None:
        fail("give texts as arguments or --input FILE, not both")
    if texts:
        return texts, len(texts)
    if input_file is not None:
        if not input_file.is_file():
            fail(f"input file not found: {input_file}")
        lines = input_file.read_text(encoding="utf-8").splitlines()
        return lines, len(lines)
    if sys.stdin.isatty():
        fail("no text: give TEXT arguments, --input FILE, or pipe lines on stdin")
    return (line.rstrip("\n") for line in sys.stdin), None


@app.command()
def translate(
    texts: Annotated[
        list[str] | None, typer.Argument(help="Texts to translate (default: one per line on stdin).")
    ] = None,
    model: ModelOption = None,
    input_file: Annotated[
        Path | None,
        typer.Option(
            "--input",
            "-i",
            help="File to translate: .srt, .vtt, .html, .md, .docx by their structure (kept), sentence by sentence; "
            ".txt and any other extension as plain text, line by line, as on stdin.",
        ),
    ] = None,
    output_file: Annotated[Path | None, typer.Option("--output", "-o", help="Write translations here.")] = None,
    format: Annotated[
        str | None,
        typer.Option(
            "--format",
            help="Read the input as one document in this format: text, html, markdown, srt, vtt (docx: files only).",
        ),
    ] = None,
    beams: Annotated[int | None, typer.Option(help="Beam size; 1 is greedy (default: the model's).")] = None,
    max_new_tokens: Annotated[int | None, typer.Option(help="Most tokens to generate per text.")] = None,
    batch_size: Annotated[int, typer.Option(help="Texts per decoder batch.")] = 16,
    target_lang: Annotated[str | None, typer.Option(help=TARGET_LANG_HELP)] = None,
    source_lang: Annotated[str | None, typer.Option(help=SOURCE_LANG_HELP)] = None,
    threads: Annotated[int | None, typer.Option(help="ONNX Runtime intra-op threads (default: all cores).")] = None,
    variant: VariantOption = None,
) -> None:
    """Translate plain text line by line, in input order (empty line in, empty line out; a line too long for the
    model is cut into sentences, never truncated); or a document (.srt, .vtt, .html, .md, .docx, or --format),
    sentence by sentence with its structure kept."""
    from .documents.files import FORMATS
    from .documents.translate import translate_lines
    from .models import resolve_model_dir
    from .runtime.options import DecodeOptions, RuntimeOptions
    from .runtime.translator import Translator

    document = format is not None or (input_file is not None and input_file.suffix.lower() in FORMATS)
    if document:
        source = _check_document(texts or [], input_file, output_file, format)
    else:
        lines, total = _read_lines(texts or [], input_file)
    try:
        directory = resolve_model_dir(model, progress=lambda msg: err.print(msg))
        decoding = DecodeOptions(
            beams=beams,
            max_new_tokens=max_new_tokens,
            batch_size=batch_size,
            target_lang=target_lang,
            source_lang=source_lang,
        )
        translator = Translator(directory, RuntimeOptions(threads=threads, variant=variant), decoding)
        _report_variant(translator.manifest)
        if document:
            _translate_document(translator, source, input_file, output_file, format)
        else:
            _write(translate_lines(translator, lines), output_file, total, show_progress=input_file is not None)
    except (ModelDirError, ValueError, ImportError, OSError) as e:
        fail(str(e))


def _check_document(texts: list[str], input_file: Path | None, output_file: Path | None, format: str | None) -> str:
    """The document's text when it comes from arguments or stdin ("" when it is a file), after the checks."""
    from .documents.files import format_of

    if texts and input_file is not None:
        fail("give texts as arguments or --input FILE, not both")
    try:
        kind = format_of(input_file or "", format)
    except ValueError as e:
        fail(str(e))
    if kind == "docx" and (input_file is None or output_file is None):
        fail("a .docx document needs --input FILE and --output FILE")
    if input_file is not None:
        if not input_file.is_file():
            fail(f"input file not found: {input_file}")
        return ""
    if texts:
        return "\n".join(texts)
    if sys.stdin.isatty():
        fail("no text: give TEXT arguments, --input FILE, or pipe the document on stdin")
    return sys.stdin.read()


def _translate_document(
    translator: Any, source: str, input_file: Path | None, output_file: Path | None, format: str | None
) -> None:
    """A document translated whole, with a progress bar (counting sentences) on stderr for a file."""
    from rich.progress import Progress

    from .documents.files import format_of, translate_file, translate_string

    with Progress(console=err, disable=input_file is None, transient=True) as bar:
        task = bar.add_task("translating", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        if input_file is not None and output_file is not None:
            translate_file(translator, input_file, output_file, format, progress)
            return
        kind = format_of(input_file or "", format)
        text = input_file.read_text(encoding="utf-8-sig") if input_file is not None else source
        translated = translate_string(translator, text, kind, progress if input_file else None)
    if output_file is not None:
        output_file.write_text(translated, encoding="utf-8")
    else:
        sys.stdout.write(translated if translated.endswith("\n") else translated + "\n")


def _write(results: Iterator, output_file: Path | None, total: int | None, show_progress: bool) -> None:
    from rich.progress import Progress

    sink = open(output_file, "w", encoding="utf-8") if output_file else sys.stdout  # noqa: SIM115
    try:
        with Progress(console=err, disable=not show_progress, transient=True) as progress:
            task = progress.add_task("translating", total=total)
            for text in results:
                sink.write(text + "\n")
                sink.flush()
                progress.advance(task)
    finally:
        if output_file:
            sink.close()


@app.command(name="translate-corpus")
def translate_corpus(
    input_file: Annotated[Path, typer.Argument(help="Text (one sentence per line), JSONL or Parquet.")],
    output_file: Annotated[Path, typer.Argument(help="Where the translations go, in the input's format.")],
    model: ModelOption = None,
    workers: Annotated[int, typer.Option(help="Ray actors, each with one Translator.")] = 1,
    address: Annotated[
        str | None, typer.Option(help='A Ray cluster to run on ("auto", "ray://head:10001"; default: a local one).')
    ] = None,
    field: Annotated[str, typer.Option(help="JSONL field or Parquet column to translate.")] = "text",
    output_field: Annotated[str, typer.Option(help="JSONL field or Parquet column for the translation.")] = (
        "translation"
    ),
    block_rows: Annotated[int, typer.Option(help="Rows per block: the unit of progress and of resuming.")] = 1000,
    work_dir: Annotated[
        Path | None, typer.Option(help="Blocks and finished parts (default: OUTPUT.onnxmt-work beside the output).")
    ] = None,
    beams: Annotated[int | None, typer.Option(help="Beam size; 1 is greedy (default: the model's).")] = None,
    max_new_tokens: Annotated[int | None, typer.Option(help="Most tokens to generate per text.")] = None,
    batch_size: Annotated[int, typer.Option(help="Texts per decoder batch.")] = 16,
    target_lang: Annotated[str | None, typer.Option(help=TARGET_LANG_HELP)] = None,
    threads: Annotated[
        int | None, typer.Option(help="ONNX Runtime threads per worker (default: the cluster's CPUs / workers).")
    ] = None,
) -> None:
    """Translate a corpus on Ray Data, across the cores of this machine or a Ray cluster; run it again to resume.

    Input order and every JSONL field / Parquet column are kept. Needs the ray extra: pip install 'onnxmt[ray]'.
    """
    from rich.progress import Progress

    from .models import resolve_model_dir
    from .runtime.options import DecodeOptions
    from .scale.corpus import CorpusJob
    from .scale.corpus import translate_corpus as run

    try:
        directory = resolve_model_dir(model, progress=lambda msg: err.print(msg))
        decoding = DecodeOptions(
            beams=beams, max_new_tokens=max_new_tokens, batch_size=batch_size, target_lang=target_lang
        )
        job = CorpusJob(
            input_file, output_file, directory, decoding, field, output_field, workers, threads, block_rows, work_dir
        )
        with Progress(console=err, transient=True) as bar:
            task = bar.add_task("translating", total=None)

            def show(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

            result = run(job, address=address, progress=show)
    except (ModelDirError, ValueError, ImportError, OSError) as e:
        fail(str(e))
    resumed = f", {result.blocks_done_before} of them done by an earlier run" if result.blocks_done_before else ""
    err.print(
        f"{result.rows} rows in {result.blocks} blocks{resumed}; {workers} worker(s) x {result.threads_per_worker} "
        f"thread(s); {result.seconds} s; wrote {output_file} (work files: {result.work_dir})"
    )


@app.command()
def serve(
    models: Annotated[
        list[str] | None,
        typer.Argument(
            envvar="ONNXMT_MODEL",
            help="Exported model directories, directories of them, or hub ids (exported on first use); requests "
            "go to the model for their (source, target) pair.",
            metavar="MODEL_DIR...",
            show_default=False,
        ),
    ] = None,
    host: Annotated[str, typer.Option(envvar="ONNXMT_HOST", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(envvar="ONNXMT_PORT", help="Port to listen on.")] = 5000,
    max_batch_size: Annotated[
        int, typer.Option(envvar="ONNXMT_MAX_BATCH_SIZE", help="Most texts per decoder batch.")
    ] = 16,
    batch_window_ms: Annotated[
        float, typer.Option(envvar="ONNXMT_BATCH_WINDOW_MS", help="How long a request waits for others to batch with.")
    ] = 10.0,
    max_queue: Annotated[
        int, typer.Option(envvar="ONNXMT_MAX_QUEUE", help="Requests that may wait; more get 503 + Retry-After.")
    ] = 256,
    timeout: Annotated[
        float, typer.Option(envvar="ONNXMT_TIMEOUT", help="Seconds a request may wait and run (0: no limit).")
    ] = 60.0,
    max_chars: Annotated[int, typer.Option(envvar="ONNXMT_MAX_CHARS", help="Most characters per text.")] = 5000,
    max_texts: Annotated[int, typer.Option(envvar="ONNXMT_MAX_TEXTS", help="Most texts per request.")] = 64,
    max_body_bytes: Annotated[
        int, typer.Option(envvar="ONNXMT_MAX_BODY_BYTES", help="Largest request body; larger get 413.")
    ] = 1 << 20,
    max_beams: Annotated[int, typer.Option(envvar="ONNXMT_MAX_BEAMS", help="Largest beam a request may ask for.")] = 8,
    max_request_cost: Annotated[
        int,
        typer.Option(
            envvar="ONNXMT_MAX_REQUEST_COST",
            help="Most tokens x beams per request ((source + max new tokens) x beams, summed); more get 413 (0: none).",
        ),
    ] = 65536,
    max_batch_cost: Annotated[
        int,
        typer.Option(
            envvar="ONNXMT_MAX_BATCH_COST", help="Most tokens x beams per decoder batch: bounds memory (0: none)."
        ),
    ] = 65536,
    api_keys: Annotated[
        str | None,
        typer.Option(envvar="ONNXMT_API_KEYS", help="Comma-separated API keys; when set, /translate needs one."),
    ] = None,
    protect_all: Annotated[
        bool,
        typer.Option(envvar="ONNXMT_PROTECT_ALL", help="Every endpoint but /health and /ready needs a key too."),
    ] = False,
    cors_origins: Annotated[
        str | None,
        typer.Option(envvar="ONNXMT_CORS_ORIGINS", help="Comma-separated origins allowed from browsers, or *."),
    ] = None,
    request_timeout: Annotated[
        float,
        typer.Option(
            envvar="ONNXMT_REQUEST_TIMEOUT", help="Seconds a client may take to send a whole request; then 408."
        ),
    ] = 30.0,
    keep_alive_timeout: Annotated[
        float, typer.Option(envvar="ONNXMT_KEEP_ALIVE_TIMEOUT", help="Seconds an idle keep-alive connection is kept.")
    ] = 5.0,
    max_connections: Annotated[
        int, typer.Option(envvar="ONNXMT_MAX_CONNECTIONS", help="Open connections; more are answered 503 and closed.")
    ] = 1000,
    beams: Annotated[
        int | None, typer.Option(envvar="ONNXMT_BEAMS", help="Default beam size; 1 is greedy (default: the model's).")
    ] = None,
    max_new_tokens: Annotated[
        int | None, typer.Option(envvar="ONNXMT_MAX_NEW_TOKENS", help="Default most tokens to generate per text.")
    ] = None,
    threads: Annotated[
        int | None, typer.Option(envvar="ONNXMT_THREADS", help="ONNX Runtime intra-op threads (default: all cores).")
    ] = None,
    log_level: Annotated[str, typer.Option(envvar="ONNXMT_LOG_LEVEL", help="debug, info, warning or error.")] = "info",
    access_log: Annotated[bool, typer.Option(envvar="ONNXMT_ACCESS_LOG", help="Log every request.")] = True,
    max_loaded_models: Annotated[
        int,
        typer.Option(
            envvar="ONNXMT_MAX_LOADED_MODELS",
            help="Most models loaded at once; the least recently used is unloaded to load another (0: no limit).",
        ),
    ] = 0,
    max_loaded_mb: Annotated[
        float,
        typer.Option(
            envvar="ONNXMT_MAX_LOADED_MB",
            help="Most megabytes of model files loaded at once, least recently used unloaded first (0: no limit).",
        ),
    ] = 0.0,
    pivot: Annotated[
        str | None,
        typer.Option(
            envvar="ONNXMT_PIVOT",
            help="Translate through this language (e.g. en) when no model translates a pair directly; the answer "
            'says so ("pivot": "en").',
        ),
    ] = None,
    cache_size: Annotated[
        int,
        typer.Option(envvar="ONNXMT_CACHE_SIZE", help="Translations kept in the translation cache (0: no cache)."),
    ] = 10000,
    cache_mb: Annotated[
        float,
        typer.Option(
            envvar="ONNXMT_CACHE_MB",
            help="Most megabytes the translation cache takes; least recently used dropped first (0: no limit).",
        ),
    ] = 64.0,
    max_document_cost: Annotated[
        int,
        typer.Option(
            envvar="ONNXMT_MAX_DOCUMENT_COST",
            help="Most tokens x beams one document (file, html, stream) may cost in all; more get 413.",
        ),
    ] = 1 << 22,
    max_document_sentences: Annotated[
        int,
        typer.Option(envvar="ONNXMT_MAX_DOCUMENT_SENTENCES", help="Most sentences per document; more get 413."),
    ] = 50_000,
    max_document_texts: Annotated[
        int,
        typer.Option(
            envvar="ONNXMT_MAX_DOCUMENT_TEXTS",
            help="Most blocks of text (paragraphs, cues, cells) per document; more get 413.",
        ),
    ] = 50_000,
    max_document_unpacked_mb: Annotated[
        float,
        typer.Option(
            envvar="ONNXMT_MAX_DOCUMENT_UNPACKED_MB", help="Most megabytes a .docx may expand to; more get 413."
        ),
    ] = 64.0,
    max_document_ratio: Annotated[
        float,
        typer.Option(
            envvar="ONNXMT_MAX_DOCUMENT_RATIO",
            help="Most a .docx's zip member may expand (uncompressed / compressed); more get 413.",
        ),
    ] = 200.0,
    max_document_xml_elements: Annotated[
        int,
        typer.Option(
            envvar="ONNXMT_MAX_DOCUMENT_XML_ELEMENTS",
            help="Most XML nodes (elements, attributes, comments) in a .docx; more get 413.",
        ),
    ] = 500_000,
    document_workers: Annotated[
        int,
        typer.Option(
            envvar="ONNXMT_DOCUMENT_WORKERS", help="Processes that read and write documents, each one at a time."
        ),
    ] = 1,
    document_worker_mb: Annotated[
        int,
        typer.Option(
            envvar="ONNXMT_DOCUMENT_WORKER_MB",
            help="Address space of a document worker, in MB; a document needing more gets 413 (0: no limit).",
        ),
    ] = 4096,
    max_document_queue: Annotated[
        int,
        typer.Option(
            envvar="ONNXMT_MAX_DOCUMENT_QUEUE", help="Documents that may wait for a worker; more get 503 + Retry-After."
        ),
    ] = 16,
    max_stored_mb: Annotated[
        float,
        typer.Option(
            envvar="ONNXMT_MAX_STORED_MB",
            help="Most megabytes of translated files kept for download; the oldest go first.",
        ),
    ] = 256.0,
    keep_files_seconds: Annotated[
        float,
        typer.Option(envvar="ONNXMT_KEEP_FILES_SECONDS", help="Seconds a translated file is kept for download."),
    ] = 3600.0,
    public_url: Annotated[
        str | None,
        typer.Option(
            envvar="ONNXMT_PUBLIC_URL",
            help="The service's address as clients reach it, for translatedFileUrl (default: the request's).",
        ),
    ] = None,
    forwarded_allow_ips: Annotated[
        str | None,
        typer.Option(
            envvar="ONNXMT_FORWARDED_ALLOW_IPS",
            help='Proxies whose X-Forwarded-For/-Proto are trusted: addresses, comma-separated, or "*".',
        ),
    ] = None,
    variant: VariantOption = None,
    ray: Annotated[
        bool,
        typer.Option(
            "--ray",
            envvar="ONNXMT_RAY",
            help="Serve on Ray Serve (needs onnxmt\\[ray]): replicas of this service behind Ray's proxy, which "
            "listens on --host and --port.",
        ),
    ] = False,
    replicas: Annotated[
        int, typer.Option(envvar="ONNXMT_REPLICAS", help="With --ray: replicas (the initial number when autoscaling).")
    ] = 1,
    min_replicas: Annotated[
        int | None, typer.Option(envvar="ONNXMT_MIN_REPLICAS", help="With --ray: autoscale, down to this many.")
    ] = None,
    max_replicas: Annotated[
        int | None, typer.Option(envvar="ONNXMT_MAX_REPLICAS", help="With --ray: autoscale, up to this many.")
    ] = None,
    cpus_per_replica: Annotated[
        float,
        typer.Option(
            envvar="ONNXMT_CPUS_PER_REPLICA", help="With --ray: CPUs per replica (its threads unless --threads)."
        ),
    ] = 1.0,
    address: Annotated[
        str | None,
        typer.Option(
            envvar="ONNXMT_RAY_ADDRESS", help='With --ray: a Ray cluster ("auto", "ray://head:10001"; default: local).'
        ),
    ] = None,
) -> None:
    """Serve a LibreTranslate-compatible HTTP API (needs onnxmt\\[serve]) for one model or several; every flag
    defaults from ONNXMT_*. Several models load on first use. With --ray, as replicas on Ray Serve."""
    from .models import resolve_model_dirs
    from .runtime.options import DecodeOptions, RuntimeOptions
    from .serve.options import ServeOptions, split_list

    try:
        from .serve.server import ServeError, run
    except ImportError as e:
        fail(f"serve needs FastAPI and uvicorn: pip install 'onnxmt[serve]' ({e})")
    try:
        options = ServeOptions(
            host=host,
            port=port,
            max_batch_size=max_batch_size,
            batch_window_ms=batch_window_ms,
            max_queue=max_queue,
            timeout=timeout,
            max_chars=max_chars,
            max_texts=max_texts,
            max_body_bytes=max_body_bytes,
            max_beams=max_beams,
            max_request_cost=max_request_cost,
            max_batch_cost=max_batch_cost,
            api_keys=split_list(api_keys),
            protect_all=protect_all,
            cors_origins=split_list(cors_origins),
            request_timeout=request_timeout,
            keep_alive_timeout=keep_alive_timeout,
            max_connections=max_connections,
            log_level=log_level.lower(),
            access_log=access_log,
            max_loaded_models=max_loaded_models,
            max_loaded_mb=max_loaded_mb,
            pivot=pivot,
            cache_size=cache_size,
            cache_mb=cache_mb,
            max_document_cost=max_document_cost,
            max_document_sentences=max_document_sentences,
            max_document_texts=max_document_texts,
            max_document_unpacked_mb=max_document_unpacked_mb,
            max_document_ratio=max_document_ratio,
            max_document_xml_elements=max_document_xml_elements,
            document_workers=document_workers,
            document_worker_mb=document_worker_mb,
            max_document_queue=max_document_queue,
            max_stored_mb=max_stored_mb,
            keep_files_seconds=keep_files_seconds,
            public_url=public_url,
            forwarded_allow_ips=forwarded_allow_ips,
        )
        directories = resolve_model_dirs(models or [], progress=lambda msg: err.print(msg))
        runtime = RuntimeOptions(threads=threads, variant=variant)
        decoding = DecodeOptions(beams=beams, max_new_tokens=max_new_tokens)
        if ray:
            from .scale import rayserve

            scaling = rayserve.RayServeOptions(replicas, min_replicas, max_replicas, cpus_per_replica)
            rayserve.run(directories, options, runtime, decoding, scaling, address=address)
        else:
            run(directories, options, runtime, decoding)
    except (ModelDirError, ValueError, ImportError, OSError, ServeError) as e:
        fail(str(e))


BatchCheckOption = typer.Option(
    "--batch-check/--no-batch-check",
    help="Also translate a sample alone and in shuffled batches and report how many sentences agree (default: "
    "only for dynamic int8, whose activation scales depend on the batch).",
    show_default=False,
)
BatchSampleOption = typer.Option(help="Sentences the batch check translates (alone, then in batches of 8).")


@app.command()
def validate(
    model_dir: Annotated[Path, typer.Argument(help="Exported model directory to check.")],
    reference: Annotated[
        str, typer.Option("--reference", "-r", help="The PyTorch model it came from: hub id or local directory.")
    ],
    input_file: Annotated[
        Path | None, typer.Option("--input", "-i", help="Sentences, one per line (default: a built-in set).")
    ] = None,
    report: Annotated[Path, typer.Option(help="Report path without suffix: writes REPORT.md and REPORT.json.")] = Path(
        "onnxmt-validate"
    ),
    min_identical: Annotated[
        float, typer.Option(help="Exit 1 when the greedy or beam token-identical rate is below this.")
    ] = 1.0,
    beams: Annotated[int | None, typer.Option(help="Beam size of the beam pass (default: the model's).")] = None,
    max_new_tokens: Annotated[int | None, typer.Option(help="Most tokens to generate per sentence.")] = None,
    batch_size: Annotated[int, typer.Option(help="Sentences per batch, on both sides.")] = 1,
    target_lang: Annotated[str | None, typer.Option(help=TARGET_LANG_HELP)] = None,
    source_lang: Annotated[str | None, typer.Option(help=SOURCE_LANG_HELP)] = None,
    threads: Annotated[int | None, typer.Option(help="Threads of ONNX Runtime and torch (default: all cores).")] = None,
    batch_check: Annotated[bool | None, BatchCheckOption] = None,
    batch_sample: Annotated[int, BatchSampleOption] = 32,
) -> None:
    """Compare an exported directory with its PyTorch model: logits, token-identical rates, first differences."""
    from rich.progress import Progress

    try:
        from .export.validate import ValidateOptions, read_corpus
        from .export.validate import validate as run_validate
    except ImportError as e:
        fail(f"validate needs torch and transformers: pip install 'onnxmt[export]' ({e})")
    if input_file is not None and not input_file.is_file():
        fail(f"input file not found: {input_file}")
    if batch_size < 1 or batch_sample < 1:
        fail(f"--batch-size and --batch-sample must be at least 1, got {batch_size} and {batch_sample}")
    options = ValidateOptions(
        beams=beams,
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        target_lang=target_lang,
        source_lang=source_lang,
        threads=threads,
        batch_check=batch_check,
        batch_sample=batch_sample,
    )
    try:
        texts = read_corpus(input_file)
        with Progress(console=err, transient=True) as progress:
            task = progress.add_task("validating", total=3 * len(texts))
            result = run_validate(model_dir, reference, texts, options, lambda n: progress.advance(task, n))
    except (ModelDirError, ValueError, ImportError, OSError) as e:
        fail(str(e))
    markdown, json_path = report.with_name(report.name + ".md"), report.with_name(report.name + ".json")
    report.parent.mkdir(parents=True, exist_ok=True)
    markdown.write_text(result.to_markdown(), encoding="utf-8")
    json_path.write_text(result.to_json(), encoding="utf-8")
    Console().print(result.to_markdown(), markup=False, highlight=False, soft_wrap=True)
    err.print(f"wrote {markdown} and {json_path}")
    if result.identical_rate < min_identical:
        err.print(
            f"[red]token-identical rate {result.identical_rate:.1%} is below --min-identical {min_identical:.1%}[/red]"
        )
        raise typer.Exit(code=1)


@app.command()
def quantize(
    model_dir: Annotated[Path, typer.Argument(help="Exported (fp32) model directory; it is not modified.")],
    output_dir: Annotated[Path, typer.Argument(help="New directory to write (must be new or empty unless --force).")],
    parts: Annotated[str, typer.Option(help="Graphs to quantize: encoder, decoder or all.")] = "all",
    exclude: Annotated[
        list[str] | None,
        typer.Option(help="Node to keep in float (lm_head: the tied LM head); repeat, or separate with commas."),
    ] = None,
    op_types: Annotated[str, typer.Option(help="Operators to quantize, comma-separated.")] = "MatMul,Gemm,Gather",
    int4: Annotated[
        bool, typer.Option("--int4", help="Weight-only int4 (MatMulNBits) instead of dynamic int8.")
    ] = False,
    per_channel: Annotated[bool, typer.Option(help="int8 scales per output channel (else per tensor).")] = True,
    per_row_scales: Annotated[
        bool,
        typer.Option(
            "--per-row-scales",
            help="int8 activations with a scale per row (token), not per batch tensor: a sentence's output no "
            "longer depends on what it is batched with (docs/serve.md).",
        ),
    ] = False,
    block_size: Annotated[int, typer.Option(help="int4: weights per scale (a power of two, at least 16).")] = 32,
    force: Annotated[bool, typer.Option("--force", help="Replace a non-empty OUTPUT_DIR.")] = False,
) -> None:
    """Quantize a model directory into a new one (int8 dynamic, or int4 weight-only) and print sizes before/after."""
    try:
        from .export.quantize import QuantizeOptions
        from .export.quantize import quantize as run_quantize
    except ImportError as e:
        fail(f"quantize needs onnx: pip install 'onnxmt[export]' ({e})")
    names = tuple(n.strip() for item in exclude or [] for n in item.split(",") if n.strip())
    options = QuantizeOptions(
        parts=parts,
        op_types=tuple(t.strip() for t in op_types.split(",") if t.strip()),
        exclude=names,
        per_channel=per_channel,
        per_row_scales=per_row_scales,
        int4=int4,
        block_size=block_size,
        force=force,
    )
    with err.status("quantizing") as status:
        try:
            manifest, results = run_quantize(model_dir, output_dir, options, progress=lambda m: status.update(m))
        except (ModelDirError, ValueError, ImportError, OSError) as e:
            fail(str(e))
    table = Table(
        title=f"{model_dir} -> {output_dir} ({manifest.quantization['method'] if manifest.quantization else ''})"
    )
    for column in ("file", "before", "after", "after/before", "nodes quantized"):
        table.add_column(column, justify="left" if column == "file" else "right")
    for r in results:
        ratio = f"{r.bytes_after / r.bytes_before:.0%}" if r.bytes_before else ""
        nodes = str(len(r.quantized_nodes)) if r.quantized_nodes else ""
        sizes = [_size(n) if n else "none" for n in (r.bytes_before, r.bytes_after)]
        table.add_row(r.file, *sizes, ratio, nodes)
    before, after = sum(r.bytes_before for r in results), sum(r.bytes_after for r in results)
    table.add_row("total", _size(before), _size(after), f"{after / before:.0%}", "", style="bold")
    Console().print(table)
    err.print(f"[green]wrote {output_dir}[/green]")


@app.command(name="eval")
def evaluate(
    model_dirs: Annotated[list[Path], typer.Argument(help="Model directories to compare.")],
    src: Annotated[Path, typer.Option(help="Source sentences, one per line.")],
    ref: Annotated[Path, typer.Option(help="Reference translations, line by line with --src.")],
    limit: Annotated[int | None, typer.Option(help="Use the first N sentence pairs.")] = None,
    reference: Annotated[
        str | None, typer.Option(help="Add a row for this PyTorch model (hub id or directory; needs onnxmt[export]).")
    ] = None,
    beams: Annotated[int | None, typer.Option(help="Beam size (default: each model's).")] = None,
    max_new_tokens: Annotated[int | None, typer.Option(help="Most tokens to generate per sentence.")] = None,
    batch_size: Annotated[int, typer.Option(help="Batch size of the quality and throughput pass.")] = 16,
    latency_sentences: Annotated[int, typer.Option(help="Sentences timed one at a time (batch 1).")] = 20,
    threads: Annotated[int | None, typer.Option(help="Intra-op threads (default: all cores).")] = None,
    target_lang: Annotated[str | None, typer.Option(help=TARGET_LANG_HELP)] = None,
    source_lang: Annotated[str | None, typer.Option(help=SOURCE_LANG_HELP)] = None,
    tokenize: Annotated[
        str | None, typer.Option(help="sacrebleu tokenizer (default: zh for Chinese targets, else 13a).")
    ] = None,
    report: Annotated[Path, typer.Option(help="Report path without suffix: writes REPORT.md and REPORT.json.")] = Path(
        "onnxmt-eval"
    ),
    batch_check: Annotated[bool | None, BatchCheckOption] = None,
    batch_sample: Annotated[int, BatchSampleOption] = 32,
) -> None:
    """BLEU, chrF, size, latency, throughput and peak memory of model directories, side by side."""
    from rich.progress import Progress

    from .eval import COLUMNS, EvalOptions
    from .eval import evaluate as run_eval

    for path in (src, ref):
        if not path.is_file():
            fail(f"file not found: {path}")
    if batch_size < 1 or latency_sentences < 0 or batch_sample < 1:
        fail("--batch-size and --batch-sample must be at least 1 and --latency-sentences at least 0")
    options = EvalOptions(
        limit=limit,
        beams=beams,
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        latency_sentences=latency_sentences,
        threads=threads,
        target_lang=target_lang,
        source_lang=source_lang,
        tokenize=tokenize,
        batch_check=batch_check,
        batch_sample=batch_sample,
    )
    try:
        with Progress(console=err, transient=True) as progress:
            tasks: dict[str, Any] = {}

            def advance(name: str, done: int, total: int) -> None:
                if name not in tasks:
                    tasks[name] = progress.add_task(name, total=total)
                progress.update(tasks[name], completed=done)

            result = run_eval(model_dirs, src, ref, options, reference, advance)
    except (ModelDirError, ValueError, ImportError, OSError, RuntimeError) as e:
        fail(str(e))
    table = Table(title=f"{result.sentences} sentences, BLEU tokenize={result.tokenize}")
    for column in COLUMNS:
        table.add_column(
            column.replace("batch N", f"batch {batch_size}"), justify="left" if column == "model" else "right"
        )
    for row in result.rows:
        table.add_row(*row.cells())
    Console().print(table)
    markdown, json_path = report.with_name(report.name + ".md"), report.with_name(report.name + ".json")
    report.parent.mkdir(parents=True, exist_ok=True)
    markdown.write_text(result.to_markdown(), encoding="utf-8")
    json_path.write_text(result.to_json(), encoding="utf-8")
    err.print(f"wrote {markdown} and {json_path}")


@app.command()
def tune(
    model: ModelOption = None,
    max_threads: Annotated[int | None, typer.Option(help="Largest thread count to try (default: all cores).")] = None,
    tokens: Annotated[
        int, typer.Option(help="New tokens forced per sentence, so every setting does the same work.")
    ] = 30,
    batch_size: Annotated[int, typer.Option(help="Batch size of the throughput figure.")] = 16,
    rounds: Annotated[int, typer.Option(help="Interleaved rounds over all settings; medians are reported.")] = 3,
    target_lang: Annotated[str | None, typer.Option(help=TARGET_LANG_HELP)] = None,
    source_lang: Annotated[str | None, typer.Option(help=SOURCE_LANG_HELP)] = None,
    variant: VariantOption = None,
) -> None:
    """Measure intra-op threads and thread spinning on this machine; prints the fastest settings."""
    from dataclasses import replace

    from .models import resolve_model_dir
    from .runtime.tune import candidates
    from .runtime.tune import tune as run_tune

    if tokens < 1 or batch_size < 1 or rounds < 1 or (max_threads is not None and max_threads < 1):
        fail("--tokens, --batch-size, --rounds and --max-threads must be at least 1")
    try:
        directory = resolve_model_dir(model, progress=lambda msg: err.print(msg))
        with err.status("measuring") as status:
            results = run_tune(
                directory,
                [replace(c, variant=variant) for c in candidates(max_threads)],
                tokens=tokens,
                batch_size=batch_size,
                rounds=rounds,
                source_lang=source_lang,
                target_lang=target_lang,
                progress=lambda msg: status.update(msg),
            )
    except (ModelDirError, ValueError, ImportError, OSError) as e:
        fail(str(e))
    table = Table(title=f"{directory}: {tokens} tokens per sentence, medians of {rounds} rounds")
    for column in ("threads", "spinning", "batch-1 latency", f"tokens/s at batch {batch_size}"):
        table.add_column(column, justify="right")
    for r in results:
        spin = "on" if r.spinning else "off"
        table.add_row(str(r.threads), spin, f"{r.latency_ms:.0f} ms", f"{r.tokens_per_s:.0f}")
    Console().print(table)
    fastest = min(results, key=lambda r: r.latency_ms)
    busiest = max(results, key=lambda r: r.tokens_per_s)
    for what, r in (("lowest latency", fastest), ("highest throughput", busiest)):
        # The CLI and the service run with spinning off; turning it on is a library setting.
        where = f"--threads {r.threads}" if not r.spinning else "library only"
        Console().print(f"{what}: RuntimeOptions(threads={r.threads}, spinning={r.spinning})  [{where}]", markup=False)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
