"""Finding a runnable model directory for a `--model` argument, and the library's `Translator`, which takes one too.

A directory that onnxmt, Optimum or Transformers.js exported is used as it is. A hub id (default:
Helsinki-NLP/opus-mt-en-zh) is exported once into the cache (`ONNXMT_CACHE`, default ~/.cache/onnxmt) on first use,
which needs the export extra; after that the run side needs neither torch nor the hub.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from pathlib import Path

from .extras import missing_extra
from .layout import diagnose, find_variants, is_complete
from .manifest import MANIFEST_NAME, ModelDirError
from .runtime.translator import Translator as DirectoryTranslator

DEFAULT_MODEL = "Helsinki-NLP/opus-mt-en-zh"
# Multi-target models need a language token; these are the defaults onnxmt picks for well-known hub models.
DEFAULT_TARGETS = {"Helsinki-NLP/opus-mt-en-zh": "cmn_Hans"}
_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


def cache_dir() -> Path:
    return Path(os.environ.get("ONNXMT_CACHE", Path.home() / ".cache" / "onnxmt")).expanduser()


def is_model_dir(path: Path) -> bool:
    """A directory the runtime can try to load: an onnxmt manifest, or a complete Optimum/Transformers.js variant."""
    if not path.is_dir():
        return False
    return (path / MANIFEST_NAME).is_file() or any(is_complete(parts) for parts in find_variants(path).values())


def looks_like_path(model: str) -> bool:
    """`./x`, `../x`, `/x`, `~/x`, `x/y/z`, `C:\\x`: a path the user typed, never a hub id (an `org/name` whose
    parts do not start with a dot)."""
    return (
        model.startswith((".", "/", "~", "\\"))
        or "\\" in model
        or Path(model).is_absolute()
        or not _HUB_ID.match(model)
        or any(part.startswith(".") for part in model.split("/"))
    )


def resolve_model_dir(model: str | Path | None, progress: Callable[[str], None] = print) -> Path:
    """A model directory for `model`, the same way for the CLI's `--model` and `Translator(model)`: a directory
    as it is (ModelDirError saying what is missing when it is not a model directory), a path that does not exist
    as not found, a hub id from onnxmt's cache or exported there on first use (which needs the export extra)."""
    model = str(model) if model else os.environ.get("ONNXMT_MODEL") or DEFAULT_MODEL
    path = Path(model).expanduser()
    if is_model_dir(path):
        return path
    if path.is_dir():
        raise ModelDirError(diagnose(path))  # what it holds and what is missing: never a guess at what it is
    if path.exists():
        raise ModelDirError(f"{model} is a file; give a model directory (or a hub id such as {DEFAULT_MODEL})")
    if looks_like_path(model):
        raise ModelDirError(f"model directory not found: {model}")
    cached = cache_dir() / "models" / model.replace("/", "--")
    if is_model_dir(cached):
        return cached
    try:
        from .export.exporter import ExportOptions, export
    except ImportError as e:
        raise missing_extra(
            f"{model} is not exported yet (or give an exported directory); exporting it", "export", e
        ) from e
    progress(f"first use of {model}: exporting it to {cached} (once)")
    export(model, cached, ExportOptions(default_target=DEFAULT_TARGETS.get(model), force=True), progress=progress)
    return cached


def model_dirs_in(path: Path) -> list[Path]:
    """`path` itself when it is a model directory, else the model directories directly inside it (sorted by
    name); ModelDirError saying what is there when there are none."""
    if is_model_dir(path):
        return [path]
    if not path.is_dir():
        raise ModelDirError(f"model directory not found: {path}")
    found = sorted(child for child in path.iterdir() if is_model_dir(child))
    if not found:
        raise ModelDirError(
            f"{path} is neither a model directory nor a directory of model directories: {diagnose(path)}"
        )
    return found


def resolve_model_dirs(models: list[str], progress: Callable[[str], None] = print) -> list[Path]:
    """`onnxmt serve DIR [DIR ...]`: each a model directory, a directory of model directories, or a hub id
    (exported on first use); none: the default model."""
    dirs: list[Path] = []
    for model in models or [""]:
        path = Path(model).expanduser()
        if model and path.is_dir() and not is_model_dir(path):
            dirs.extend(model_dirs_in(path))
        else:
            dirs.append(resolve_model_dir(model or None, progress))
    return dirs


class Translator(DirectoryTranslator):
    """`onnxmt.Translator`: the runtime's Translator of a model directory, or of a hub id resolved as the CLI resolves
    it (`resolve_model_dir`: the cache, an export on first use, the same clear error when the hub is unreachable).

    >>> translator = Translator("Helsinki-NLP/opus-mt-en-zh")    # doctest: +SKIP
    >>> translator.translate(["Hello world"])[0].text            # doctest: +SKIP
    """

    @staticmethod
    def model_dir(given: str | Path) -> Path:
        return resolve_model_dir(given, progress=logging.getLogger("onnxmt").info)
