"""The `onnxmt` command line: one module per command, each option generated from the field of the options
dataclass that declares it (`flags.py`). Build-side commands import torch lazily; run-side commands never do."""

from __future__ import annotations

import warnings
from typing import Annotated

import typer
from rich.markup import escape

from ..version import __version__
from .common import err
from .eval import evaluate
from .export import export
from .help import Command, Group
from .inspect import inspect
from .keys import keys
from .quantize import quantize
from .serve import serve
from .translate import translate
from .translate_corpus import translate_corpus
from .tune import tune
from .validate import validate

__all__ = ["app", "main"]

app = typer.Typer(
    name="onnxmt",
    cls=Group,
    help="HuggingFace translation models on ONNX Runtime, without torch: export, prove, shrink, translate, serve.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
for name, command in (
    ("export", export),
    ("inspect", inspect),
    ("translate", translate),
    ("translate-corpus", translate_corpus),
    ("serve", serve),
    ("validate", validate),
    ("quantize", quantize),
    ("eval", evaluate),
    ("tune", tune),
):
    app.command(name=name, cls=Command)(command)
app.add_typer(keys, name="keys")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"onnxmt {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", "-V", callback=_version, is_eager=True, help="Show the version and exit."),
    ] = False,
) -> None:
    """HuggingFace translation models on ONNX Runtime, without torch: export, prove, shrink, translate, serve."""


def _show_warning(message: Warning | str, category: type[Warning], *args: object, **kwargs: object) -> None:
    """A warning as one line on stderr, without the source path and line Python prints by default."""
    err.print(f"[yellow]warning:[/yellow] {escape(str(message))}", highlight=False, soft_wrap=True)


def main() -> None:
    warnings.showwarning = _show_warning
    app(prog_name="onnxmt")
