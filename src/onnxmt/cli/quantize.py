"""`onnxmt quantize`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from ..export.quantize import QuantizeOptions
from .common import OutputDirArgument, building, err, size
from .flags import flags, with_options


@with_options(options=flags(QuantizeOptions))
def quantize(
    model_dir: Annotated[Path, typer.Argument(help="Exported (fp32) model directory; it is not modified.")],
    output_dir: OutputDirArgument,
    *,
    options: QuantizeOptions,
) -> None:
    """Quantize a model directory into a new one (int8 dynamic, or int4 weight-only) and print sizes before/after."""
    with building("quantizing", "onnxmt quantize") as progress:
        from ..export.quantize import quantize as run_quantize

        manifest, results = run_quantize(model_dir, output_dir, options, progress=progress)
    method = manifest.quantization["method"] if manifest.quantization else ""
    Console().print(_table(f"{model_dir} -> {output_dir} ({method})", results))
    err.print(f"[green]wrote {output_dir}[/green]")


def _table(title: str, results: list[Any]) -> Table:
    """Each file's size before and after, and the nodes quantized."""
    table = Table(title=title)
    for column in ("file", "before", "after", "after/before", "nodes quantized"):
        table.add_column(column, justify="left" if column == "file" else "right")
    for r in results:
        ratio = f"{r.bytes_after / r.bytes_before:.0%}" if r.bytes_before else ""
        nodes = str(len(r.quantized_nodes)) if r.quantized_nodes else ""
        sizes = [size(n) if n else "none" for n in (r.bytes_before, r.bytes_after)]
        table.add_row(r.file, *sizes, ratio, nodes)
    before, after = sum(r.bytes_before for r in results), sum(r.bytes_after for r in results)
    table.add_row("total", size(before), size(after), f"{after / before:.0%}", "", style="bold")
    return table
