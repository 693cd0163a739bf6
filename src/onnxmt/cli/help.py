"""`--help` that reads on an 80-column terminal: the command and group classes every onnxmt command uses.

Typer's help is a table of flag names, value types and help text, squeezed to the terminal's width; at 80 columns
long flag names were cut (`--max-document-xml-e…`) to make room for types such as `<list[str]>`. Here a value
option shows a short metavar (N, TEXT, PATH), a switch (`--help`, `--force`) none, arguments appear in the usage
line in capitals without braces, and commands with many flags group them in panels (`Flags(panel=...)`).
"""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any

from typer.core import TyperCommand, TyperGroup

# A value's metavar by its Python type; anything else: TEXT.
_METAVARS: dict[Any, str] = {int: "N", float: "X", str: "TEXT", Path: "PATH", bool: ""}


def _metavar(param: Any) -> str | None:
    """The metavar of an option that has none: "" for a switch, else by the type of its value; None to leave the
    framework's."""
    if getattr(param, "is_flag", False):
        return ""
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    if annotation is None:  # typer before 0.2x: click's parameter types
        name = getattr(getattr(param, "type", None), "name", None)
        return {"integer": "N", "float": "X", "text": "TEXT", "path": "PATH"}.get(name or "")
    kinds = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
    kind = next((k for k in kinds if k is not type(None)), str)
    if typing.get_origin(kind) is list:
        kind = typing.get_args(kind)[0]
    return _METAVARS.get(kind, "TEXT")


def _tidy(command: Any, ctx: Any) -> None:
    for param in command.get_params(ctx):
        if getattr(param, "param_type_name", "") == "argument":
            if hasattr(param, "display_type_rich"):  # typer 0.2x: `<list[str]>` beside the argument's name
                param.display_type_rich = lambda ctx: None
            continue
        if param.metavar is not None:
            continue
        metavar = _metavar(param)
        if metavar is not None:
            param.metavar = metavar


class Command(TyperCommand):
    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        """`[OPTIONS] MODEL_DIR OUTPUT_DIR`, `[TEXTS]...`: arguments in capitals, optional ones in brackets."""
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if getattr(param, "param_type_name", "") != "argument":
                continue
            name = (param.metavar or param.name or "").upper().removesuffix("...")
            name = name if param.required else f"[{name}]"
            pieces.append(name + ("..." if param.nargs != 1 else ""))
        return pieces

    def format_help(self, ctx: Any, formatter: Any) -> None:
        _tidy(self, ctx)
        super().format_help(ctx, formatter)


class Group(TyperGroup):
    def format_help(self, ctx: Any, formatter: Any) -> None:
        _tidy(self, ctx)
        super().format_help(ctx, formatter)
