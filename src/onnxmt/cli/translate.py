"""`onnxmt translate`: plain text line by line, or a document with its structure kept."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from ..architectures import check_text_unit
from ..manifest import ModelDirError
from ..runtime.options import BatchLimits, DecodeOptions, RuntimeOptions
from .common import ModelOption, SourceLangOption, TargetLangOption, err, fail, report_variant
from .flags import flags, with_options


@with_options(
    decoding=flags(DecodeOptions, "beams", "max_new_tokens"),
    batching=flags(BatchLimits, "batch_size"),
    runtime=flags(RuntimeOptions, "threads", "variant"),
)
def translate(
    texts: Annotated[
        list[str] | None, typer.Argument(help="Texts to translate (default: one per line on stdin).")
    ] = None,
    model: ModelOption = None,
    input_file: Annotated[
        Path | None,
        typer.Option(
            "--input",
            "-i",
            help="File to translate: .srt, .vtt, .html, .md, .docx by their structure (kept), sentence by sentence; "
            ".txt and any other extension as plain text, line by line, as on stdin.",
        ),
    ] = None,
    output_file: Annotated[Path | None, typer.Option("--output", "-o", help="Write translations here.")] = None,
    format: Annotated[
        str | None,
        typer.Option(
            "--format",
            help="Read the input as one document in this format: text, html, markdown, srt, vtt (docx: files only).",
        ),
    ] = None,
    source_lang: SourceLangOption = None,
    target_lang: TargetLangOption = None,
    unit: Annotated[
        str | None,
        typer.Option(
            help="Give the model sentences or paragraphs (lines) at a time: sentence or paragraph (default: the "
            "model's family's: sentence for encoder-decoder models, paragraph for decoder-only translators)."
        ),
    ] = None,
    glossary: Annotated[
        Path | None,
        typer.Option(
            help="Terms to translate as given: a .tsv file, one 'source<TAB>target' pair a line (models with a "
            "terminology prompt: HY-MT)."
        ),
    ] = None,
    context: Annotated[
        str | None,
        typer.Option(
            help="Text the translation should agree with, not translated (models with a context prompt: HY-MT)."
        ),
    ] = None,
    show_prompt: Annotated[
        bool,
        typer.Option(
            "--show-prompt",
            help="Print what the model is given for each text (its whole prompt and its ids) instead of translating.",
        ),
    ] = False,
    *,
    decoding: DecodeOptions,
    batching: BatchLimits,
    runtime: RuntimeOptions,
) -> None:
    """Translate plain text line by line, in input order (empty line in, empty line out), each line sentence by
    sentence or whole, as the model's family is given text (--unit; a part too long for the model is cut, never
    truncated); or a document (.srt, .vtt, .html, .md, .docx, or --format) with its structure kept."""
    from ..documents.files import FORMATS
    from ..documents.translate import translate_lines
    from ..models import resolve_model_dir
    from ..runtime.translator import Translator

    document = format is not None or (input_file is not None and input_file.suffix.lower() in FORMATS)
    if document:
        source = _check_document(texts or [], input_file, output_file, format)
    else:
        lines, total = _read_lines(texts or [], input_file)
    request: dict[str, Any] = {"source_lang": source_lang, "target_lang": target_lang, "context": context}
    request["glossary"] = _read_glossary(glossary) if glossary is not None else ()
    try:
        check_text_unit(unit)
        directory = resolve_model_dir(model, progress=lambda msg: err.print(msg))
        translator = Translator(directory, runtime, decoding, batching)
        translator.prompt(**request)  # an unknown language or a refused glossary fails here, before any output
        report_variant(translator.manifest)
        if show_prompt:
            shown = _document_texts(source, input_file, format) if document else list(lines)
            _show_prompts(translator, shown, unit, request)
        elif document:
            _translate_document(translator, source, input_file, output_file, format, {**request, "unit": unit})
        else:
            translated = translate_lines(translator, lines, unit=unit, **request)
            _write(translated, output_file, total, show_progress=input_file is not None)
    except (ModelDirError, ValueError, ImportError, OSError) as e:
        fail(str(e))


def _read_glossary(path: Path) -> list[tuple[str, str]]:
    """--glossary's pairs: one `source<TAB>target` a line, blank lines skipped; a one-line error naming the line
    that is not a pair."""
    pairs = []
    for number, line in enumerate(_read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 2 or not fields[0].strip() or not fields[1].strip():
            fail(f"{path}, line {number}: not a 'source<TAB>target' pair")
        pairs.append((fields[0].strip(), fields[1].strip()))
    return pairs


def _document_texts(source: str, input_file: Path | None, format: str | None) -> list[str]:
    """The texts of a document (its paragraphs, cues, cells), as they are translated."""
    from ..documents.files import format_of, prepare

    kind = format_of(input_file or "", format)
    data = input_file.read_bytes() if input_file is not None else source.encode("utf-8")
    return prepare(data, kind)[0]


def _show_prompts(translator: Any, texts: list[str], unit: str | None, request: dict[str, Any]) -> None:
    """--show-prompt: each unit of text the model is given (texts cut as they are translated), its whole input
    (a decoder-only model's rendered chat prompt) and the ids, numbered."""
    from ..documents.translate import counting, plan_texts

    plan = plan_texts(texts, counting(translator, unit=unit, **request), tokenizer=translator.tokenizer)
    for number, sentence in enumerate(plan.sentences, 1):
        shown = translator.model_input(sentence, **request)
        forced = "" if shown.forced_bos is None else f"; the output starts with {shown.forced_bos}"
        sys.stdout.write(f"--- text {number}: {len(shown.ids)} ids{forced}\n{shown.text}\n{list(shown.ids)}\n")


def _read_lines(texts: list[str], input_file: Path | None) -> tuple[list[str] | Iterator[str], int | None]:
    if texts and input_file is not None:
        fail("give texts as arguments or --input FILE, not both")
    if texts:
        return _check_arguments(texts), len(texts)
    if input_file is not None:
        lines = _read_text(input_file).splitlines()
        return lines, len(lines)
    if sys.stdin.isatty():
        fail("no text: give TEXT arguments, --input FILE, or pipe lines on stdin")
    return _stdin_lines(), None


def _check_input(input_file: Path) -> None:
    if input_file.is_dir():
        fail(f"{input_file} is a directory; --input takes a file")
    if not input_file.is_file():
        fail(f"input file not found: {input_file}")


def _read_text(input_file: Path) -> str:
    """The text of a plain-text or text-based document file; a one-line error naming it when it is not text."""
    _check_input(input_file)
    data = input_file.read_bytes()
    if b"\0" in data:
        fail(f"{input_file} is not a text file (it holds binary data); onnxmt translates UTF-8 text, {_KINDS}")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        fail(f"{input_file}: {_not_utf8(data, e)}")


def _stdin_lines() -> Iterator[str]:
    """stdin line by line as it arrives; ValueError (one line, exit 2) at the first line that is not UTF-8."""
    for number, raw in enumerate(sys.stdin.buffer, 1):
        try:
            line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"stdin, line {number}: not UTF-8 text (byte 0x{raw[e.start]:02x})") from None
        yield line.rstrip("\r\n") if line.endswith("\r\n") else line.rstrip("\n")


def _check_arguments(texts: list[str]) -> list[str]:
    """Arguments the shell passed as bytes that are not UTF-8 reach Python as lone surrogates."""
    for number, text in enumerate(texts, 1):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            fail(f"text argument {number} is not UTF-8 text")
    return texts


_KINDS = "line by line, or .srt, .vtt, .html, .md and .docx documents"


def _not_utf8(data: bytes, error: UnicodeDecodeError) -> str:
    line = data.count(b"\n", 0, error.start) + 1
    return f"not UTF-8 text (byte 0x{data[error.start]:02x} on line {line}); convert it first, e.g. iconv -t UTF-8"


def _check_document(texts: list[str], input_file: Path | None, output_file: Path | None, format: str | None) -> str:
    """The document's text when it comes from arguments or stdin ("" when it is a file), after the checks."""
    from ..documents.files import format_of

    if texts and input_file is not None:
        fail("give texts as arguments or --input FILE, not both")
    try:
        kind = format_of(input_file or "", format)
    except ValueError as e:
        fail(str(e))
    if kind == "docx" and (input_file is None or output_file is None):
        fail("a .docx document needs --input FILE and --output FILE")
    if input_file is not None:
        if kind == "docx":
            _check_input(input_file)
        else:
            _read_text(input_file)  # a file that is not text fails here, named
        return ""
    if texts:
        return "\n".join(_check_arguments(texts))
    if sys.stdin.isatty():
        fail("no text: give TEXT arguments, --input FILE, or pipe the document on stdin")
    data = sys.stdin.buffer.read()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        fail(f"stdin: {_not_utf8(data, e)}")


def _translate_document(
    translator: Any,
    source: str,
    input_file: Path | None,
    output_file: Path | None,
    format: str | None,
    request: dict[str, Any],
) -> None:
    """A document translated whole, with a progress bar (counting sentences) on stderr for a file."""
    from rich.progress import Progress

    from ..documents.files import format_of, translate_file, translate_string

    with Progress(console=err, disable=input_file is None, transient=True) as bar:
        task = bar.add_task("translating", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        if input_file is not None and output_file is not None:
            translate_file(translator, input_file, output_file, format, progress, **request)
            return
        kind = format_of(input_file or "", format)
        text = _read_text(input_file) if input_file is not None else source
        translated = translate_string(translator, text, kind, progress if input_file else None, **request)
    if output_file is not None:
        output_file.write_text(translated, encoding="utf-8")
    else:
        sys.stdout.write(translated if translated.endswith("\n") else translated + "\n")


def _write(results: Iterator[str], output_file: Path | None, total: int | None, show_progress: bool) -> None:
    from rich.progress import Progress

    sink = open(output_file, "w", encoding="utf-8") if output_file else sys.stdout  # noqa: SIM115
    try:
        with Progress(console=err, disable=not show_progress, transient=True) as progress:
            task = progress.add_task("translating", total=total)
            for text in results:
                sink.write(text + "\n")
                sink.flush()
                progress.advance(task)
    finally:
        if output_file:
            sink.close()
