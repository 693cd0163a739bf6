"""The `onnxmt` command line: one module per command, each option generated from the field of the options
dataclass that declares it (`flags.py`). Build-side commands import torch lazily; run-side commands never do."""

from __future__ import annotations

import typer

from .eval import evaluate
from .export import export
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
    help="HuggingFace translation models on ONNX Runtime, without torch: export, prove, shrink, translate, serve.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
for command in (export, inspect, translate):
    app.command()(command)
app.command(name="translate-corpus")(translate_corpus)
for command in (serve, validate, quantize):
    app.command()(command)
app.command(name="eval")(evaluate)
app.command()(tune)
app.add_typer(keys, name="keys")


def main() -> None:
    app()
