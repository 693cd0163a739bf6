"""What the commands share: errors, the options that are no dataclass's field (the model, the language pair, a
report's path), sizes and the variant line."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

err = Console(stderr=True)


@contextmanager
def building(what: str, command: str) -> Iterator[Callable[[str], None]]:
    """A build step (`onnxmt export`, `onnxmt quantize`) under a status line `what`, given `progress(message)`. A
    missing optional dependency exits 2 with the command that installs the export extra; a ValueError (a bad
    directory or option) or an OSError, with its message."""
    from ..extras import missing_extra

    with err.status(what) as status:
        try:
            yield lambda message: say(status, message)
        except ImportError as e:
            fail(str(missing_extra(command, "export", e)))
        except (ValueError, OSError) as e:
            fail(str(e))


def say(status: Any, message: str) -> None:
    """A long step's progress on the status line; a notice (a removed leftover) printed to stay."""
    if message.startswith("removed "):
        err.print(f"[yellow]{message}[/yellow]")
    else:
        status.update(message)


def fail(message: str) -> NoReturn:
    """A user error: `Error: ...` on stderr, one line however long (the terminal wraps it, so it can be copied
    whole), and exit code 2, no traceback."""
    err.print(f"[red]Error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
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
# The language pair goes with the texts (`Translator.translate`'s keywords), not into DecodeOptions.
SourceLangOption = Annotated[
    str | None,
    typer.Option(
        help="Source language of a model told it by a token, in the model's codes or as clients write them: "
        "eng_Latn, en (NLLB-200, M2M100; default: the model's, English). Other models check it against their one "
        "source."
    ),
]
TargetLangOption = Annotated[
    str | None,
    typer.Option(
        help="Target language of a multi-target model, as clients write it: zh, zt, zh-TW, cmn_Hant, >>cmn_Hant<< "
        "(see /languages of onnxmt serve)."
    ),
]
# What `export` and `quantize` write: a new directory, never an existing one's files mixed with its own.
OutputDirArgument = Annotated[Path, typer.Argument(help="Directory to write (must be new or empty unless --force).")]
REPORT_HELP = "Also write the report to REPORT.md and REPORT.json (a path without suffix)."


def write_report(report: Path, markdown: str, json: str) -> None:
    """REPORT.md and REPORT.json, and a line on stderr saying so."""
    markdown_path, json_path = report.with_name(report.name + ".md"), report.with_name(report.name + ".json")
    report.parent.mkdir(parents=True, exist_ok=True)
    markdown_path.write_text(markdown, encoding="utf-8")
    json_path.write_text(json, encoding="utf-8")
    err.print(f"wrote {markdown_path} and {json_path}")


def size(n: int | None) -> str:
    if n is None:
        return "?"
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def variants(manifest: Any) -> str:
    """`quantized (also present: fp32, q4)` for Optimum/Transformers.js directories; the onnxmt directory's one."""
    from ..layout import onnxmt_variant

    chosen = manifest.provenance.get("variant") or onnxmt_variant(manifest.quantization)
    others = [v for v in manifest.provenance.get("variants", []) if v != chosen]
    return chosen + (f" (also present: {', '.join(others)}; choose with --variant)" if others else "")


def report_variant(manifest: Any) -> None:
    """On stderr, which variant of an Optimum/Transformers.js directory runs, when it holds more than one."""
    if len(manifest.provenance.get("variants", [])) > 1:
        err.print(f"variant: {escape(variants(manifest))}", highlight=False)
