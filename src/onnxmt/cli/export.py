"""`onnxmt export`."""

from __future__ import annotations

from typing import Annotated

import typer

from ..export.exporter import ExportOptions
from .common import OutputDirArgument, building, err
from .flags import flags, with_options


@with_options(options=flags(ExportOptions))
def export(
    model: Annotated[str, typer.Argument(help="Hub id (e.g. Helsinki-NLP/opus-mt-en-zh) or local model directory.")],
    output_dir: OutputDirArgument,
    *,
    options: ExportOptions,
) -> None:
    """Export a translation model (MarianMT, M2M100, NLLB-200, mBART-50, T5, mT5, MADLAD-400) to a self-contained
    onnxmt directory (needs onnxmt\\[export])."""
    with building("exporting", "onnxmt export") as progress:
        from ..export.exporter import export as run_export

        _, report = run_export(model, output_dir, options, progress=progress)
    if report is not None:
        err.print(report.describe())
    err.print(f"[green]wrote {output_dir}[/green]")
