"""`onnxmt validate`: an exported directory against its PyTorch model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from ..export.validate import ValidateOptions
from ..extras import missing_extra
from ..manifest import ModelDirError
from .common import REPORT_HELP, SourceLangOption, TargetLangOption, err, fail, write_report
from .flags import flags, with_options

HELPS = {
    "decoding.beams": "Beam size of the beam pass (default: the model's).",
    "batching.batch_size": "Sentences per batch, on both sides.",
    "runtime.threads": "Threads of ONNX Runtime and torch (default: all cores).",
}


@with_options(
    options=flags(
        ValidateOptions,
        "decoding.beams",
        "decoding.max_new_tokens",
        "batching.batch_size",
        "runtime.threads",
        "invariance.batch_check",
        "invariance.batch_sample",
        helps=HELPS,
    )
)
def validate(
    model_dir: Annotated[Path, typer.Argument(help="Exported model directory to check.")],
    reference: Annotated[
        str, typer.Option("--reference", "-r", help="The PyTorch model it came from: hub id or local directory.")
    ],
    input_file: Annotated[
        Path | None, typer.Option("--input", "-i", help="Sentences, one per line (default: a built-in set).")
    ] = None,
    report: Annotated[Path | None, typer.Option(help=REPORT_HELP)] = None,
    min_identical: Annotated[
        float, typer.Option(help="Exit 1 when the greedy or beam token-identical rate is below this.")
    ] = 1.0,
    source_lang: SourceLangOption = None,
    target_lang: TargetLangOption = None,
    *,
    options: ValidateOptions,
) -> None:
    """Compare an exported directory with its PyTorch model: logits, token-identical rates, first differences."""
    from dataclasses import replace

    from rich.progress import Progress

    try:
        from ..export.validate import read_corpus
        from ..export.validate import validate as run_validate
    except ImportError as e:
        fail(str(missing_extra("onnxmt validate", "export", e)))
    if input_file is not None and not input_file.is_file():
        fail(f"input file not found: {input_file}")
    options = replace(options, source_lang=source_lang, target_lang=target_lang)
    try:
        texts = read_corpus(input_file)
        with Progress(console=err, transient=True) as progress:
            task = progress.add_task("validating", total=3 * len(texts))
            result = run_validate(model_dir, reference, texts, options, lambda n: progress.advance(task, n))
    except ImportError as e:
        fail(str(missing_extra("onnxmt validate", "export", e)))
    except (ModelDirError, ValueError, OSError) as e:
        fail(str(e))
    if report is not None:
        write_report(report, result.to_markdown(), result.to_json())
    Console().print(result.to_markdown(), markup=False, highlight=False, soft_wrap=True)
    if result.identical_rate < min_identical:
        err.print(
            f"[red]token-identical rate {result.identical_rate:.1%} is below --min-identical {min_identical:.1%}[/red]"
        )
        raise typer.Exit(code=1)
