"""Finding a runnable model directory for a `--model` argument.

A directory that onnxmt, Optimum or Transformers.js exported is used as it is. A hub id (default:
Helsinki-NLP/opus-mt-en-zh) is exported once into the cache (`ONNXMT_CACHE`, default ~/.cache/onnxmt) on first use,
which needs the export extra; after that the run side needs neither torch nor the hub.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

from .extras import missing_extra
from .layout import diagnose, find_variants, is_complete
from .manifest import MANIFEST_NAME, ModelDirError

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


def resolve_model_dir(model: str | None, progress: Callable[[str], None] = print) -> Path:
    """A model directory for `model` (a directory or a hub id), exporting a hub model on first use."""
    model = model or os.environ.get("ONNXMT_MODEL") or DEFAULT_MODEL
    path = Path(model).expanduser()
    if is_model_dir(path):
        return path
    if path.is_dir():
        raise ModelDirError(diagnose(path))  # what it holds and what is missing: never a guess at what it is
    if path.exists() or not _HUB_ID.match(model):
        raise ModelDirError(f"model directory not found: {model}")
    cached = cache_dir() / "models" / model.replace("/", "--")
    if is_model_dir(cached):
        return cached
    try:
        from .export.exporter import ExportOptions, export
    except ImportError as e:
        raise missing_extra(
            f"{model!r} is not exported yet (or pass an exported directory); exporting", "export", e
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
