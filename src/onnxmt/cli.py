"""The `onnxmt` command line. Build-side commands import torch lazily; run-side commands never do."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .manifest import ModelDirError

app = typer.Typer(
    name="onnxmt",
    help="HuggingFace translation models on ONNX Runtime: export, inspect, translate.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err = Console(stderr=True)


def fail(message: str) -> NoReturn:
    """A user error: `Error: ...` on stderr and exit code 2, no traceback."""
    err.print(f"[red]Error:[/red] {escape(message)}", highlight=False)
    raise typer.Exit(code=2)


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
) -> None:
    """Export a MarianMT model to a self-contained onnxmt model directory (needs onnxmt\\[export])."""
    try:
        from .export.exporter import ExportOptions
        from .export.exporter import export as run_export
    except ImportError as e:
        fail(f"export needs torch and transformers: pip install 'onnxmt[export]' ({e})")
    options = ExportOptions(opset=opset, revision=revision, force=force, default_target=default_target, check=check)
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
def inspect(model_dir: Annotated[Path, typer.Argument(help="onnxmt or Optimum model directory.")]) -> None:
    """Show a model directory: manifest summary and every graph's inputs and outputs."""
    from .runtime.modeldir import load_manifest

    try:
        manifest = load_manifest(model_dir, verify=True)
    except (ModelDirError, OSError) as e:
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
        "target tokens": ", ".join(sorted(langs.get("target_tokens", {}))) or "(single target)",
        "default target": str(langs.get("default_target")),
        "quantization": str(manifest.quantization or "none (fp32)"),
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
    input_file: Annotated[Path | None, typer.Option("--input", "-i", help="File with one text per line.")] = None,
    output_file: Annotated[Path | None, typer.Option("--output", "-o", help="Write translations here.")] = None,
    beams: Annotated[int | None, typer.Option(help="Beam size; 1 is greedy (default: the model's).")] = None,
    max_new_tokens: Annotated[int | None, typer.Option(help="Most tokens to generate per text.")] = None,
    batch_size: Annotated[int, typer.Option(help="Texts per decoder batch.")] = 16,
    target_lang: Annotated[str | None, typer.Option(help="Target language of a multi-target model.")] = None,
    threads: Annotated[int | None, typer.Option(help="ONNX Runtime intra-op threads (default: all cores).")] = None,
) -> None:
    """Translate texts, one translation per line, in input order (empty line in, empty line out)."""
    from .models import resolve_model_dir
    from .runtime.options import DecodeOptions, RuntimeOptions
    from .runtime.translator import Translator

    lines, total = _read_lines(texts or [], input_file)
    try:
        directory = resolve_model_dir(model, progress=lambda msg: err.print(msg))
        decoding = DecodeOptions(
            beams=beams, max_new_tokens=max_new_tokens, batch_size=batch_size, target_lang=target_lang
        )
        translator = Translator(directory, RuntimeOptions(threads=threads), decoding)
        _write(translator.translate_iter(lines), output_file, total, show_progress=input_file is not None)
    except (ModelDirError, ValueError, ImportError, OSError) as e:
        fail(str(e))


def _write(results: Iterator, output_file: Path | None, total: int | None, show_progress: bool) -> None:
    from rich.progress import Progress

    sink = open(output_file, "w", encoding="utf-8") if output_file else sys.stdout  # noqa: SIM115
    try:
        with Progress(console=err, disable=not show_progress, transient=True) as progress:
            task = progress.add_task("translating", total=total)
            for result in results:
                sink.write(result.text + "\n")
                sink.flush()
                progress.advance(task)
    finally:
        if output_file:
            sink.close()


@app.command()
def serve(
    model: Annotated[
        str | None,
        typer.Argument(envvar="ONNXMT_MODEL", help="Exported model directory (or a hub id exported on first use)."),
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
    api_keys: Annotated[
        str | None,
        typer.Option(envvar="ONNXMT_API_KEYS", help="Comma-separated API keys; when set, /translate needs one."),
    ] = None,
    cors_origins: Annotated[
        str | None,
        typer.Option(envvar="ONNXMT_CORS_ORIGINS", help="Comma-separated origins allowed from browsers, or *."),
    ] = None,
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
) -> None:
    """Serve a LibreTranslate-compatible HTTP API (needs onnxmt\\[serve]); every flag defaults from ONNXMT_*."""
    from .models import resolve_model_dir
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
            api_keys=split_list(api_keys),
            cors_origins=split_list(cors_origins),
            log_level=log_level.lower(),
            access_log=access_log,
        )
        directory = resolve_model_dir(model, progress=lambda msg: err.print(msg))
        run(
            directory,
            options,
            RuntimeOptions(threads=threads),
            DecodeOptions(beams=beams, max_new_tokens=max_new_tokens),
        )
    except (ModelDirError, ValueError, ImportError, OSError, ServeError) as e:
        fail(str(e))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
