"""The command that installs an optional extra, for the way this onnxmt was installed.

onnxmt is installed from a checkout (`pip install ".[serve]"`, or `-e`); an error that names
`pip install onnxmt[serve]` sends the user to a package index that does not have it, and unquoted brackets fail in
zsh. pip records where a package came from (PEP 610's `direct_url.json`); the hint repeats that source, quoted.
"""

from __future__ import annotations

import json
import shlex
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

__all__ = ["MissingExtraError", "install_command", "missing_extra"]

# Modules whose distribution has another name.
_DISTRIBUTIONS = {"docx": "python-docx", "multipart": "python-multipart"}
_CHECKOUT = Path(__file__).resolve().parents[2]  # src/onnxmt/extras.py -> the checkout, when run from one


class MissingExtraError(ImportError):
    """An optional dependency is not installed; the message says which extra and the command that installs it."""


def install_command(extra: str) -> str:
    """`pip install '<where onnxmt came from>[extra]'`, quoted for any shell."""
    source, editable = _source()
    return "pip install " + ("-e " if editable else "") + shlex.quote(f"{source}[{extra}]")


def missing_extra(what: str, extra: str, error: ImportError) -> MissingExtraError:
    """The one-line error for `what` (e.g. "onnxmt export") lacking the module of `error` (returned as it is when
    it already says which extra)."""
    if isinstance(error, MissingExtraError):
        return error
    module = f" ({_DISTRIBUTIONS.get(error.name, error.name)} is not installed)" if error.name else ""
    return MissingExtraError(f"{what} needs the {extra} extra{module}: {install_command(extra)}")


def _source() -> tuple[str, bool]:
    """(what pip installed onnxmt from, whether editable): a checkout's path, an archive's URL, or the name."""
    direct = _direct_url()
    if (_CHECKOUT / "pyproject.toml").is_file():  # run from a checkout: editable, or on PYTHONPATH
        url = direct.get("url", "")
        editable = url.startswith("file://") and Path(unquote(urlparse(url).path)).resolve() == _CHECKOUT
        return _display(_CHECKOUT), editable and bool(direct.get("dir_info", {}).get("editable"))
    url = direct.get("url", "")
    if url.startswith("file://"):
        return _display(Path(unquote(urlparse(url).path))), False
    return url or "onnxmt", False  # a URL pip installed from, or a package index


def _direct_url() -> dict[str, Any]:
    """PEP 610's record of where pip installed onnxmt from; {} when from an index or not installed."""
    try:
        text = metadata.distribution("onnxmt").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return {}
    return json.loads(text) if text else {}


def _display(path: Path) -> str:
    """The path as the user would type it: relative to the current directory when inside it."""
    try:
        relative = path.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return str(path)
    return "." if str(relative) == "." else f"./{relative}"
