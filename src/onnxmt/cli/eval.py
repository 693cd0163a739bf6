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
    "batching.batch_size": "Batch size of the quality and throughput pass.",
}


@with_options(
    options=flags(
        EvalOptions,
        "limit",
        "decoding.beams",
        "decoding.max_new_tokens",
        "batching.batch_size",
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
    report: Annotated[Path | None, typer.Option(help=REPORT_HELP)] = None,
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
    out = Console()
    out.print(_table(result, out.width))
    if _notes(result):
        out.print(_notes(result), markup=False, highlight=False)
    if report is not None:
        write_report(report, result.to_markdown(), result.to_json())


def _table(result: Any, width: int) -> Table:
    """Models as rows when they fit the terminal's width, else as columns (a metric per row)."""
    from ..eval import COLUMNS

    header = [c.replace("batch N", f"batch {result.options.batching.batch_size}") for c in COLUMNS]
    rows = [row.cells() for row in result.rows]
    if not any(row.batch_invariance for row in result.rows):
        header, rows = header[:-1], [cells[:-1] for cells in rows]
    title = f"{result.sentences} sentences, BLEU tokenize={result.tokenize}"
    needed = sum(max(len(h), *(len(r[i]) for r in rows)) + 3 for i, h in enumerate(header)) + 1
    if needed <= width:
        table = Table(title=title)
        for i, column in enumerate(header):
            table.add_column(column, justify="left" if i == 0 else "right")
        for cells in rows:
            table.add_row(*cells)
        return table
    table = Table(title=title)
    table.add_column("")
    for name in _short_names([cells[0] for cells in rows]):
        table.add_column(name, justify="right", overflow="fold")
    for i, metric in enumerate(header[1:], 1):
        table.add_row(metric, *(cells[i] for cells in rows))
    return table


def _short_names(models: list[str]) -> list[str]:
    """Each model's directory name, when that tells them apart."""
    names = [Path(model).name or model for model in models]
    return names if len(set(names)) == len(names) else models


def _notes(result: Any) -> str:
    from ..eval import BATCHED_NOTE

    if any(row.batch_invariance for row in result.rows):
        return BATCHED_NOTE.format(sample=min(result.options.invariance.batch_sample, result.sentences))
    return ""
