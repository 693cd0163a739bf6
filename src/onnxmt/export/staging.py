"""A model directory is written whole or not at all: into a staging directory next to the output, moved into place
once complete, so that a failure leaves nothing behind and nothing reads half a directory."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def occupied(output: Path) -> bool:
    """Whether writing a directory at `output` would replace something: a file, or a directory that is not empty."""
    return output.exists() and (not output.is_dir() or any(output.iterdir()))


@contextmanager
def staged(output: Path) -> Iterator[Path]:
    """A new private directory beside `output` to write into; when the block ends without an error it replaces
    `output`, and in every case it is gone afterwards."""
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        yield staging
        if output.exists():
            shutil.rmtree(output) if output.is_dir() else output.unlink()
        staging.rename(output)
        output.chmod(0o755)  # mkdtemp made it private
    finally:
        shutil.rmtree(staging, ignore_errors=True)
