"""`onnxmt eval`: quality, size, speed and memory of model directories, side by side."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from ..eval import EvalOptions
from ..manifest import ModelDirError
from .common import REPORT_HELP, SourceLangOption, TargetLangOption, err, fail, write_report
from .flags import flags, with_options

HELPS = {
    "decoding.beams": "Beam size (default: each model's).",
    "decoding.batch_size": "Batch size of the quality and throughput pass.",
}


@with_options(
    options=flags(
        EvalOptions,
        "limit",
        "decoding.beams",
        "decoding.max_new_tokens",
        "decoding.batch_size",
        "latency_sentences",
        "runtime.threads",
        "tokenize",
        "invariance.batch_check",
        "invariance.batch_sample",
        helps=HELPS,
    )
)
def evaluate(
    model_dirs: Annotated[list[Path], typer.Argument(help="Model directories to compare.")],
    src: Annotated[Path, typer.Option(help="Source sentences, one per line.")],
    ref: Annotated[Path, typer.Option(help="Reference translations, line by line with --src.")],
    reference: Annotated[
        str | None, typer.Option(help="Add a row for this PyTorch model (hub id or directory; needs onnxmt\\[export]).")
    ] = None,
    report: Annotated[Path, typer.Option(help=REPORT_HELP)] = Path("onnxmt-eval"),
    source_lang: SourceLangOption = None,
    target_lang: TargetLangOption = None,
    *,
    options: EvalOptions,
) -> None:
    """BLEU, chrF, size, latency, throughput and peak memory of model directories, side by side."""
    from rich.progress import Progress

    from ..eval import evaluate as run_eval

    for path in (src, ref):
        if not path.is_file():
            fail(f"file not found: {path}")
    options = replace(options, source_lang=source_lang, target_lang=target_lang)
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
    Console().print(_table(result))
    write_report(report, result.to_markdown(), result.to_json())


def _table(result: Any) -> Table:
    from ..eval import COLUMNS

    table = Table(title=f"{result.sentences} sentences, BLEU tokenize={result.tokenize}")
    batch_size = result.options.decoding.batch_size
    for column in COLUMNS:
        table.add_column(
            column.replace("batch N", f"batch {batch_size}"), justify="left" if column == "model" else "right"
        )
    for row in result.rows:
        table.add_row(*row.cells())
    return table
