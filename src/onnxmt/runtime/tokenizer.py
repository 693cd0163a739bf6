"""A model directory's tokenizer, by the kind its manifest names (the families register the kinds they use)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..architectures import tokenizer_loader
from ..manifest import ModelDirError


def load_tokenizer(directory: str | Path, kind: str | None) -> Any:
    """The tokenizer of a model directory, by the manifest's `tokenizer.kind` (None, in manifests before format 3:
    the kind of the family those were all exported from)."""
    try:
        loader = tokenizer_loader(kind)
    except ValueError as e:
        raise ModelDirError(str(e)) from e
    return loader(Path(directory))
