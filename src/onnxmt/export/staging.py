"""A model directory is written whole or not at all: into a staging directory next to the output, moved into place
once complete, so that a failure leaves nothing behind and nothing reads half a directory.

A process that is killed (SIGKILL, out of memory) cannot remove its staging directory, which for a 3B model holds
tens of GB. Its name carries the writing process's id, so the next export or quantize to the same output removes
what a dead process left, and says so."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


def occupied(output: Path) -> bool:
    """Whether writing a directory at `output` would replace something: a file, or a directory that is not empty."""
    return output.exists() and (not output.is_dir() or any(output.iterdir()))


@contextmanager
def staged(output: Path, notice: Callable[[str], None] = lambda message: None) -> Iterator[Path]:
    """A new private directory beside `output` to write into; when the block ends without an error it replaces
    `output`, and in every case it is gone afterwards. Staging directories of `output` that a dead process left
    are removed first (each told to `notice`)."""
    output.parent.mkdir(parents=True, exist_ok=True)
    for stale in abandoned(output):
        shutil.rmtree(stale, ignore_errors=True)
        notice(f"removed {stale}: a half-written directory left by an earlier run that did not finish")
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.{os.getpid()}.", dir=output.parent))
    try:
        yield staging
        if output.exists():
            shutil.rmtree(output) if output.is_dir() else output.unlink()
        staging.rename(output)
        output.chmod(0o755)  # mkdtemp made it private
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def abandoned(output: Path) -> list[Path]:
    """Staging directories of `output` whose writing process is gone."""
    found = []
    prefix = f".{output.name}."
    for path in output.parent.glob(f"{prefix}*"):
        pid = path.name[len(prefix) :].split(".", 1)[0]
        if path.is_dir() and pid.isdigit() and not _alive(int(pid)):
            found.append(path)
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True
